"""The public generation API: batched free-form generation of one or several streams.

Prompts are batched longest-first within the memory budget (:mod:`.memory`), the shared
prefix and each batch are prefilled once (:mod:`.prefill`), and every stream (a temperature,
nucleus mass and seed, :class:`Stream`) of a batch decodes in one forward per step. Each
(stream, prompt) keeps its own generator, so outputs do not depend on batching. A row stops at
an end-of-turn token or stop string (``finish_reason`` "eos") or at ``max_new_tokens``
("length"); ``latency_s`` runs from the start of the item's batch prefill.
"""

from __future__ import annotations

import dataclasses
import time

import torch

from ..errors import CellError
from .batching import BatchRecord, Progress, run_with_oom_fallback
from .decode import DecodeStats, Generation, decode_continuous, decode_rows, decode_stream_columns
from .cache import fork_cache
from .attention import GROUPED_NAMES, attn_implementation
from .capabilities import Capabilities
from .encoding import encode_prompt
from .memory import MemoryBudget, ModelDims, budget_for, generation_footprint, plan_batches
from .prefill import build_prefix, prefill
from .sampling import NonFiniteLogits, Stream, _Sampler  # NonFiniteLogits: re-exported (cells)
from .store import PrefillStore


def generate_multi_seed(lm, prompts: list[str], seeds: list[int], *, max_new_tokens: int,
                        temperature: float, top_p: float = 1.0, batch_size: int = 16,
                        progress=None, prefix_cache: bool = True,
                        stream_columns: bool = True,
                        store: PrefillStore | None = None,
                        window_full: bool = True,
                        record: BatchRecord | None = None) -> dict[int, list[Generation]]:
    """Generate ``prompts`` once per seed: :func:`generate_streams` with one stream per seed.
    Returns ``{seed: [Generation in input order]}``, in fp32 identical to separate
    ``generate(..., seed=s)`` calls (in bf16/NF4 a batched forward's summation order can flip a
    sampled token). Greedy (temperature 0) decodes once and copies the result to every seed."""
    seeds = list(dict.fromkeys(int(s) for s in seeds))
    if not seeds:
        raise ValueError("generate_multi_seed: no seeds")
    greedy = float(temperature) == 0.0
    decode_seeds = seeds[:1] if greedy else seeds
    outs = generate_streams(lm, prompts, [Stream(float(temperature), float(top_p), s) for s in decode_seeds],
                            max_new_tokens=max_new_tokens, batch_size=batch_size, progress=progress,
                            prefix_cache=prefix_cache, stream_columns=stream_columns, store=store,
                            window_full=window_full, record=record)
    ordered = dict(zip(decode_seeds, outs))
    if greedy:  # one decode serves every seed; later seeds get copies
        base = ordered[decode_seeds[0]]
        return {s: base if s == decode_seeds[0] else copy_generations(base) for s in seeds}
    return ordered


def copy_generations(gens: list[Generation]) -> list[Generation]:
    """Independent copies (own token id lists), for a decode that serves several seeds."""
    return [dataclasses.replace(g, token_ids=list(g.token_ids)) for g in gens]


def generate_streams(lm, prompts: list[str], streams: list[Stream], *, max_new_tokens: int,
                     batch_size: int = 16, progress=None, prefix_cache: bool = True,
                     stream_columns: bool = True, store: PrefillStore | None = None,
                     window_full: bool = True, window_masks: bool | None = None,
                     record: BatchRecord | None = None,
                     budget: MemoryBudget | None = None,
                     refill: bool | None = None) -> list[list[Generation]]:
    """Decode every prompt under each of ``streams``; one list of generations (input order) per
    stream. In fp32 a stream's outputs equal a separate call's.

    ``stream_columns``: where the model takes a 4D mask, a prompt's streams decode as columns
    of its one cache row (:func:`.decode.decode_stream_columns`), else as repeated rows, one
    temperature/top_p kind at a time. ``store``: prefixes and prefills reused across calls
    (:class:`.store.PrefillStore`). ``window_full``: run sliding-window layers as full
    attention when the whole call fits in the window; ``window_masks``: past the window, mask
    the sliding layers by position where the model allows it, else share no prefix (None:
    :data:`.capabilities.WINDOW_MASKS`; :class:`.capabilities.Capabilities`). ``budget``: the
    memory budget batches are sized against (default: ``lm``'s device, less the store's
    bytes). ``record``
    (:class:`.batching.BatchRecord`) receives the batch plan and every out-of-memory split.
    ``refill`` (with stream columns): decode as one continuous batch whose finished rows take
    the next queued prompt (:func:`.decode.decode_continuous`); default None = on for
    accelerators, off on a CPU, where it saves no forwards once the ring wraps (benchmark:
    benchmarks/bench_refill.py)."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if not streams:
        raise ValueError("generate_streams: no streams")
    _Sampler.for_streams(streams, [""])  # validate arguments early
    if not prompts:
        return [[] for _ in streams]
    enc = [encode_prompt(lm.tokenizer, p) for p in prompts]
    for i, e in enumerate(enc):
        if not e:
            raise CellError(f"item {i}: the prompt encodes to no tokens; nothing to generate from")
    k = len(streams)
    bar = Progress(progress, len(prompts) * k, "generate")
    results: list[dict[int, Generation]] = [{} for _ in streams]
    # A sliding-window model (Gemma-3) attends fully when the whole call stays inside its
    # window: then it gets packed prefill, the detached prefix and stream columns too.
    caps = Capabilities.of(lm, max(len(e) for e in enc) + max_new_tokens, window_full=window_full,
                           window_masks=window_masks)
    try:
        with torch.inference_mode():
            prefix = build_prefix(lm, enc, caps, enabled=prefix_cache, store=store)
            # past a sliding window whose masks the engine builds, every call decodes as
            # columns (one stream too): only their step masks count the window in positions
            columns = caps.mask_4d and (caps.window_mask or (stream_columns and k > 1))
            stats = DecodeStats()

            def run(rows: list[int]) -> dict:
                t0 = time.perf_counter()
                cache, mask, logits = prefill(lm, prefix, [enc[i] for i in rows], caps, store=store)
                t_pre = time.perf_counter() - t0
                # All streams decode together, stream-major (row s * n + j = stream s of
                # prompt j): either as columns of one cache row per prompt (the prompt's
                # keys/values stored and read once), or with the prefilled rows repeated once
                # per stream. Either way each decode step is one forward for all streams.
                n = len(rows)
                t1 = time.perf_counter()
                row_prompts = [prompts[i] for i in rows]
                # Columns pay for masked-out keys (the other streams' tokens) to store and read
                # each prompt's own columns once; they are used wherever the model supports
                # them (benchmarks/bench_seed_columns.py, RESULTS.md section 3b).
                if columns:
                    gens = decode_stream_columns(lm, cache, mask, logits,
                                                _Sampler.for_streams(streams, row_prompts), n_seeds=k,
                                                max_new_tokens=max_new_tokens,
                                                n_prompt=[len(enc[i]) for i in rows], t0=t1,
                                                prefix=prefix, stats=stats, caps=caps)
                elif k > 1:
                    # Repeated rows: each row holds its own copy of its prompt, so one decode of
                    # every stream would read ``k`` copies per step; streams of the same
                    # temperature and top_p decode together, kinds one after another from the
                    # same prefill.
                    gens = [None] * (n * k)
                    kinds: dict[tuple, list[int]] = {}
                    for si, st in enumerate(streams):
                        kinds.setdefault((st.temperature, st.top_p), []).append(si)
                    for members in kinds.values():
                        rep = torch.arange(n, device=mask.device).repeat(len(members))
                        c, m, lg = fork_cache(cache, rows=rep), mask.index_select(0, rep), logits.index_select(0, rep)
                        sub = _Sampler.for_streams([streams[si] for si in members], row_prompts)
                        part = decode_rows(lm, c, m, lg, sub, max_new_tokens=max_new_tokens,
                                       n_prompt=[len(enc[i]) for i in rows] * len(members),
                                       t0=time.perf_counter(), prefix=prefix, stats=stats)
                        for mi, si in enumerate(members):
                            gens[si * n:(si + 1) * n] = part[mi * n:(mi + 1) * n]
                else:
                    gens = decode_rows(lm, cache, mask, logits, _Sampler.for_streams(streams, row_prompts),
                                   max_new_tokens=max_new_tokens,
                                   n_prompt=[len(enc[i]) for i in rows], t0=t1, prefix=prefix,
                                   stats=stats)
                for g in gens:
                    g.latency_s = round(g.latency_s + t_pre, 6)
                bar.update(n * k)
                return {i: [gens[s * n + j] for s in range(k)] for j, i in enumerate(rows)}

            dims = ModelDims.of(lm)
            grouped = attn_implementation(lm.model) in GROUPED_NAMES
            if budget is None:
                budget = budget_for(lm, dims, store_bytes=store.max_bytes if store is not None else 0)
            kinds: dict[tuple, int] = {}
            for st in streams:
                kinds[(st.temperature, st.top_p)] = kinds.get((st.temperature, st.top_p), 0) + 1

            def footprint(n_rows: int, width: int) -> int:
                return generation_footprint(dims, rows=n_rows, width=width, prefix=len(prefix),
                                            detached=prefix.detached, streams=k,
                                            max_new_tokens=max_new_tokens,
                                            columns=bool(columns) or k == 1,
                                            largest_kind=max(kinds.values()), grouped=grouped)

            plan = plan_batches([len(e) - len(prefix) for e in enc], batch_size, footprint,
                                budget.budget_bytes)
            if record is not None:
                record.plans.append({
                    "what": "generation", "budget": budget.record(), "streams": k,
                    "stream_columns": bool(columns), "grouped_attention": grouped,
                    "prefix_tokens": len(prefix),
                    "max_new_tokens": max_new_tokens, "batch_size_cap": batch_size,
                    "batches": [{"prompts": len(b), "longest": max(len(enc[i]) for i in b),
                                 "footprint_bytes": f} for b, f in plan]})
            if refill is None:
                refill = lm.info.get("device", "cpu") != "cpu"
            continuous = bool(refill and columns and not caps.window_mask)
            if record is not None:
                record.plans[-1]["refill"] = continuous
            slots = [len(plan[0][0])]  # rows of a continuous batch (halved on out-of-memory)

            def run_queue(queue: list[int]) -> dict:
                sampler = _Sampler.for_streams(streams, [prompts[i] for i in queue])
                gens = decode_continuous(lm, prefix, caps, [enc[i] for i in queue], sampler,
                                         n_seeds=k, max_new_tokens=max_new_tokens,
                                         slots=min(slots[0], len(queue)), store=store, stats=stats)
                if gens is None:  # cache layers that cannot run as a ring: batch by batch
                    return {i: g for b, _ in plan_batches([len(enc[i]) - len(prefix) for i in queue],
                                                          slots[0], footprint, budget.budget_bytes)
                            for i, g in run([queue[j] for j in b]).items()}
                bar.update(len(queue) * k)
                n = len(queue)
                return {i: [gens[s * n + j] for s in range(k)] for j, i in enumerate(queue)}

            def on_oom():
                slots[0] = max(1, slots[0] // 2)
                if store is not None:
                    store.discard("batch")

            work = [[i for b, _ in plan for i in b]] if continuous else [b for b, _ in plan]
            for rows in work:
                done = run_with_oom_fallback(rows, run_queue if continuous else run,
                                             what="generation", device=lm.info["device"],
                                             n_tokens=lambda rs: sum(len(enc[i]) for i in rs),
                                             splits=record.splits if record is not None else None,
                                             on_oom=on_oom)
                for i, per_stream in done.items():
                    for s, g in enumerate(per_stream):
                        results[s][i] = g
            if record is not None:
                record.decode.append({"refill": continuous, "rows": slots[0], **stats.as_dict()})
    finally:
        bar.close()
    return [[res[i] for i in range(len(prompts))] for res in results]


def generate(lm, prompts: list[str], *, max_new_tokens: int, temperature: float,
             top_p: float = 1.0, seed: int = 0, batch_size: int = 16, progress=None,
             prefix_cache: bool = True, store: PrefillStore | None = None,
             window_full: bool = True, record: BatchRecord | None = None) -> list[Generation]:
    """Generate one continuation per prompt (input order); see the module docstring."""
    return generate_multi_seed(lm, prompts, [seed], max_new_tokens=max_new_tokens,
                               temperature=temperature, top_p=top_p, batch_size=batch_size,
                               progress=progress, prefix_cache=prefix_cache,
                               store=store, window_full=window_full, record=record)[int(seed)]
