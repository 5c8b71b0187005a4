"""Batched free-form generation with an explicit decode loop.

* Prompts are tokenised by :func:`..encoding.encode_prompt`, grouped longest-first into
  batches of ``batch_size`` and left-padded; results come back in input order.
* The token prefix shared by all prompts is prefilled once (:mod:`.kvcache`); each batch
  prefills its suffixes once (packed without padding where the model allows), and decodes
  into preallocated cache buffers (:func:`.kvcache.reserve`).
* Greedy when ``temperature == 0`` (argmax; ties -> lowest token id, as ``torch.argmax`` and
  transformers' greedy search). Otherwise softmax(logits / temperature), restricted to the
  nucleus of mass ``top_p`` (smallest set of most likely tokens whose mass reaches top_p), and
  sampled by inverse CDF with one uniform draw per step from a per-item ``torch.Generator``.
  Each item's generator is seeded from ``(seed, prompt text)`` (:func:`item_seed`), so a
  sampled item's output does not depend on batch size, batch composition or position in the
  call: same seed -> identical outputs, different seed -> different draws.
* A row stops at an end-of-turn token (``lm.stop_ids``: eos ids and the chat template's
  end-of-turn token such as ``<|im_end|>`` / ``<end_of_turn>``), at the plain format's turn
  marker ``"\\nUser:"`` (base models, ``lm.stop_strings``; the text is cut before it), or after
  ``max_new_tokens``. ``finish_reason`` is ``"eos"`` for the first two, ``"length"`` otherwise.
  ``n_gen_tokens`` counts generated tokens including the stop token; ``text`` excludes the stop
  token/marker and special tokens. Finished rows leave the batch (their cache rows are dropped).
* :func:`generate_streams` prefills each batch once and decodes several *streams* (a
  :class:`Stream` is a temperature, nucleus mass and seed: greedy and sampled ones may mix)
  in one batch, the streams of a prompt as columns of its one cache row
  (:func:`_decode_seed_columns`) where the model allows, else from the prefilled rows repeated
  once per stream; each (stream, prompt) keeps its own generator, so in fp32 its outputs are
  identical to a separate :func:`generate` call. :func:`generate_multi_seed` is the one-
  temperature case (one stream per seed).
* ``latency_s``: seconds from the start of the item's batch prefill until the item stopped
  (for multi-seed: the shared prefill time plus that seed's decode time). The one-off shared
  prefix prefill is not attributed to items.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import time
from dataclasses import dataclass, field

import torch

from ..errors import CellError
from .batching import BatchRecord, Progress, run_with_oom_fallback
from .encoding import encode_prompt
from .kvcache import (Prefix, PrefillStore, build_prefix, drop_rows, fork_cache, forward,
                      packed_prefill_supported, prefill, reserve, window_as_full)
from .memory import MemoryBudget, ModelDims, budget_for, generation_footprint, plan_batches
from .packing import attention_mask_4d


@dataclass
class Generation:
    text: str
    n_prompt_tokens: int
    n_gen_tokens: int
    finish_reason: str  # "eos" | "length"
    latency_s: float
    token_ids: list[int] = field(default_factory=list, repr=False)  # generated ids


def item_seed(seed: int, prompt: str) -> int:
    """63-bit seed of one item's sampling generator, derived from the cell seed and the
    prompt text."""
    h = hashlib.sha256(f"{int(seed)}\0{prompt}".encode()).digest()
    return int.from_bytes(h[:8], "little") & ((1 << 63) - 1)


@dataclass(frozen=True)
class Stream:
    """One decoding of every prompt of a call: its temperature (0: greedy), nucleus mass and
    seed. A call decodes several streams together (:func:`generate_streams`)."""
    temperature: float
    top_p: float = 1.0
    seed: int = 0


# ``exp(x)`` for x < -87.34 is a subnormal float32, which x86 CPUs compute through a microcode
# assist ~75x slower than the vectorised path (``exp_`` over 262,144 float32 values in [-200, 0]:
# 4.7 ms; in [-10, 0]: 0.06 ms). Over a vocabulary, (logit - max) / T falls that low for most
# tokens once the logits spread by more than 87 T (26 at T=0.3), so the sampler spent most of its
# time on tokens of probability < 1e-38 (45% of a Gemma-3 chain-of-thought decode group). The
# row sampler clamps the shifted logits here first: a clamped token's weight moves from
# exp(x) < 1.2e-38 to exp(-87) = 1.6e-38 next to the top token's 1, so a whole vocabulary of
# them adds < 5e-33 to a total >= 1, below the resolution of the float64 sums and uniforms
# that locate the draw (``tests/test_sampling.py`` checks the draws against the unclamped ones).
EXP_FLOOR = -87.0


class _Sampler:
    """Per-row next-token choice. Row r is greedy (argmax) when its temperature is 0, else it
    draws from its own generator seeded by (seed_r, prompt_r). One temperature / top_p / seed
    for all rows, or per row (``temperatures``, ``top_ps``, ``seeds``)."""

    def __init__(self, temperature: float, top_p: float, seed: int, prompts: list[str],
                 seeds: list[int] | None = None, *, temperatures: list[float] | None = None,
                 top_ps: list[float] | None = None):
        n = len(prompts)
        temps = [float(t) for t in temperatures] if temperatures is not None else [float(temperature)] * n
        tops = [float(t) for t in top_ps] if top_ps is not None else [float(top_p)] * n
        for t in temps or [float(temperature)]:
            if t < 0:
                raise ValueError(f"temperature must be >= 0, got {t}")
        for t in tops or [float(top_p)]:
            if not 0 < t <= 1:
                raise ValueError(f"top_p must be in (0, 1], got {t}")
        row_seeds = seeds if seeds is not None else [seed] * n
        self.temps, self.top_ps = temps, tops
        self.gens = [torch.Generator().manual_seed(item_seed(s, p)) if t > 0 else None
                     for s, p, t in zip(row_seeds, prompts, temps)]
        self.greedy = all(t == 0 for t in temps)

    @classmethod
    def for_streams(cls, streams: list[Stream], prompts: list[str]) -> "_Sampler":
        """Rows stream-major: row ``s * len(prompts) + j`` is stream s of prompt j."""
        n = len(prompts)
        return cls(0.0, 1.0, 0, list(prompts) * len(streams),
                   seeds=[st.seed for st in streams for _ in range(n)],
                   temperatures=[st.temperature for st in streams for _ in range(n)],
                   top_ps=[st.top_p for st in streams for _ in range(n)])

    def _uniforms(self, active: list[int]) -> torch.Tensor:
        """One float64 uniform per active row, each from the row's own generator."""
        return torch.stack([torch.rand((), generator=self.gens[r], dtype=torch.float64)
                            for r in active])

    def __call__(self, logits: torch.Tensor, active: list[int]) -> torch.Tensor:
        """The next token of each row of ``logits`` ([len(active), V], any float dtype); row j
        belongs to sequence ``active[j]``."""
        if self.greedy:
            return logits.argmax(dim=-1)
        if logits.device.type == "cpu" and all(self.top_ps[r] == 1.0 for r in active):
            return self._draw_rows(logits, active)
        params = [(self.temps[r], self.top_ps[r]) for r in active]
        kinds = list(dict.fromkeys(params))
        if len(kinds) == 1:
            return self._draw_batch(logits, active, *kinds[0])
        out = torch.empty(len(active), dtype=torch.long, device=logits.device)
        for t, p in kinds:  # mixed streams: each kind of row on its own
            js = [j for j, k in enumerate(params) if k == (t, p)]
            idx = torch.tensor(js, dtype=torch.long, device=logits.device)
            out[idx] = self._draw_batch(logits.index_select(0, idx), [active[j] for j in js], t, p)
        return out

    def _draw_batch(self, logits: torch.Tensor, active: list[int], temperature: float | None = None,
                    top_p: float | None = None) -> torch.Tensor:
        """Softmax, nucleus and inverse CDF over the whole batch at once, all rows at one
        temperature / top_p (accelerators, and ``top_p < 1``)."""
        temperature = self.temps[active[0]] if temperature is None else temperature
        top_p = self.top_ps[active[0]] if top_p is None else top_p
        if temperature == 0:
            return logits.argmax(dim=-1)
        probs = torch.softmax(logits.float() / temperature, dim=-1)
        if top_p < 1.0:
            probs, order = probs.sort(dim=-1, descending=True)
            before = probs.cumsum(dim=-1) - probs  # mass strictly before each token
            probs = probs.masked_fill(before >= top_p, 0.0)
        else:
            order = None
        cdf = probs.cumsum(dim=-1)
        u = self._uniforms(active).to(device=cdf.device, dtype=cdf.dtype)
        u = u * cdf[:, -1]
        idx = torch.searchsorted(cdf, u.unsqueeze(1)).clamp_(max=cdf.shape[1] - 1)
        if order is not None:
            idx = order.gather(1, idx)
        return idx.squeeze(1)

    _BLOCK = 1024

    def _draw_rows(self, logits: torch.Tensor, active: list[int]) -> torch.Tensor:
        """The same inverse-CDF draw (``top_p == 1``), one row at a time on the CPU.

        A row of a 150k-260k vocabulary is 0.6-1 MB in float32, so its exponentials stay in
        the core's cache, where the whole-batch version streams [rows, V] tensors through
        memory for every pass and allocates three of them per step. The cumulative sum is
        taken in two levels: float64 sums of blocks of 1,024 exponentials locate the block
        where u times the row total falls, then a float64 cumulative sum within that block
        locates the token (measured on 60 rows: 121 -> 22 ms per step for Gemma's 262k
        vocabulary, 74 -> 15 ms for Qwen's 152k; ``tests/test_sampling.py``). The draw is
        the same: token = first index whose cumulative exp((logit - max) / T) reaches u
        times the row's total; it differs from the batch version only by the rounding of the
        cumulative sums (float64 here, float32 there) and the :data:`EXP_FLOOR` clamp
        (invisible at that rounding)."""
        n, v = logits.shape
        bs = self._BLOCK
        nb = -(-v // bs)
        if getattr(self, "_row", None) is None or self._row.numel() != nb * bs:
            self._row = torch.zeros(nb * bs, dtype=torch.float32)  # tail past v stays 0
        full, x = self._row, self._row[:v]
        blocks = full.view(nb, bs)
        sampled = [r for r in active if self.temps[r] > 0]
        u = dict(zip(sampled, self._uniforms(sampled).tolist())) if sampled else {}
        out = []
        for j, r in enumerate(active):
            if self.temps[r] == 0:
                out.append(int(logits[j].float().argmax()))  # exact widening; float32 argmax is ~2x faster
                continue
            x.copy_(logits[j])
            x.sub_(x.max()).mul_(1.0 / self.temps[r]).clamp_min_(EXP_FLOOR).exp_()
            cs = blocks.sum(1, dtype=torch.float64).cumsum_(0)
            target = u[r] * float(cs[-1])
            b = min(int(torch.searchsorted(cs, torch.tensor([target], dtype=torch.float64))), nb - 1)
            before = float(cs[b - 1]) if b else 0.0
            within = blocks[b].cumsum(0, dtype=torch.float64)
            i = int(torch.searchsorted(within, torch.tensor([target - before], dtype=torch.float64)))
            out.append(min(b * bs + min(i, bs - 1), v - 1))
        return torch.tensor(out, dtype=torch.long)


class _Outputs:
    """What each decoded sequence has produced so far, and when and why it stopped; shared by
    both decode loops."""

    def __init__(self, lm, n: int, max_new_tokens: int, t0: float):
        self.tok, self.stop_ids, self.stop_strings = lm.tokenizer, set(lm.stop_ids), lm.stop_strings
        self.max_new_tokens, self.t0 = max_new_tokens, t0
        self.ids: list[list[int]] = [[] for _ in range(n)]
        self.finish: list[str | None] = [None] * n
        self.cut: list[int | None] = [None] * n  # text cut position for stop strings
        self.latency = [0.0] * n

    def append(self, active: list[int], tokens: list[int]) -> list[int]:
        """Append ``tokens[j]`` to sequence ``active[j]``; returns the positions j of the
        sequences still running."""
        keep = []
        for j, r in enumerate(active):
            t = tokens[j]
            self.ids[r].append(t)
            if t in self.stop_ids:
                self.finish[r] = "eos"
            elif self.stop_strings:
                text = self.tok.decode(self.ids[r], skip_special_tokens=True)
                hits = [text.find(s) for s in self.stop_strings if s in text]
                if hits:
                    self.finish[r], self.cut[r] = "eos", min(hits)
            if self.finish[r] is None and len(self.ids[r]) >= self.max_new_tokens:
                self.finish[r] = "length"
            if self.finish[r] is None:
                keep.append(j)
            else:
                self.latency[r] = time.perf_counter() - self.t0
        return keep

    def generations(self, n_prompt: list[int]) -> list[Generation]:
        gens = []
        for r, ids in enumerate(self.ids):
            body = ids[:-1] if self.finish[r] == "eos" and ids and ids[-1] in self.stop_ids else ids
            text = self.tok.decode(body, skip_special_tokens=True)
            if self.cut[r] is not None:
                text = text[:self.cut[r]]
            gens.append(Generation(text=text, n_prompt_tokens=n_prompt[r], n_gen_tokens=len(ids),
                                   finish_reason=self.finish[r] or "length",
                                   latency_s=self.latency[r], token_ids=ids))
        return gens


# Finished rows leave a decoding cache in place (:func:`.kvcache.drop_rows`); False: through a
# row-selecting copy of the whole cache (:func:`.kvcache.fork_cache`), the path before it, kept
# for the equality tests.
IN_PLACE_DROP = True


def _fork_rows(cache, keep: list[int]):
    return fork_cache(cache, rows=torch.tensor(keep, dtype=torch.long)), keep


def _decode(lm, cache, mask, logits, sampler: _Sampler, *, max_new_tokens: int,
            n_prompt: list[int], t0: float, prefix: Prefix | None = None) -> list[Generation]:
    """Decode one prefilled batch; returns one Generation per row (batch order). ``prefix``:
    the call's shared prefix, when the batch cache was prefilled on a detached one
    (:func:`.kvcache.forward`)."""
    offset = prefix.offset if prefix is not None else 0
    n = logits.shape[0]
    out = _Outputs(lm, n, max_new_tokens, t0)
    active = list(range(n))
    for step in range(max_new_tokens):
        nxt = sampler(logits, active)
        keep = out.append(active, nxt.tolist())
        if not keep:
            break
        if step == 0:  # decode writes into preallocated buffers from here on
            rows = None if len(keep) == len(active) else torch.tensor(keep, dtype=torch.long)
            cache, order = reserve(cache, max_new_tokens, rows=rows), keep
        elif len(keep) < len(active):
            order = drop_rows(cache, keep) if IN_PLACE_DROP else _fork_rows(cache, keep)
            if not IN_PLACE_DROP:
                cache, order = order
        if len(keep) < len(active):
            sel = torch.tensor(order, dtype=torch.long, device=mask.device)
            mask = mask.index_select(0, sel)
            nxt = nxt.index_select(0, sel)
            active = [active[j] for j in order]
        mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
        pos = mask.sum(dim=1, keepdim=True) - 1 + offset
        logits = forward(lm, nxt.unsqueeze(1), mask, pos, cache, logits_to_keep=1,
                         prefix=prefix)[:, -1, :]
    return out.generations(n_prompt)


def _decode_seed_columns(lm, cache, mask, logits, sampler: _Sampler, *, n_seeds: int,
                         max_new_tokens: int, n_prompt: list[int], t0: float,
                         prefix: Prefix | None = None) -> list[Generation]:
    """Decode ``n_seeds`` samples of each prefilled row with ONE cache row per prompt.

    The seeds of a row are columns of that row: each decode step feeds ``n_seeds`` tokens per
    row (seed j's latest token in column j) and appends ``n_seeds`` cache columns. A 4D mask
    lets seed j's query see the prompt and its own earlier tokens only (the columns
    ``L0 + n_seeds * t + j``), with the position ids it would have alone, so each seed computes
    what a separate run computes, while the prompt's keys/values are stored and read once per
    step instead of once per seed. Rows are ordered seed-major (row ``s * n + i`` = seed s of
    prompt i), as in the repeated-rows path; finished seeds feed a masked dummy token until
    every seed of their prompt is done, then the prompt's row leaves the batch."""
    n, k = logits.shape[0], n_seeds
    out = _Outputs(lm, n * k, max_new_tokens, t0)
    dev = mask.device
    pad = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0
    active = list(range(n * k))
    row_of = list(range(n))          # current cache row of each prompt (-1 once dropped)
    alive_items = list(range(n))
    base = mask.bool()
    cur = logits.repeat(k, 1)        # [n * k, V] logits of the active sequences, in active order
    own = torch.eye(k, dtype=torch.bool, device=dev)
    for step in range(max_new_tokens):
        nxt_list = sampler(cur, active).tolist()
        keep = out.append(active, nxt_list)
        if not keep:
            break
        still = {active[j] % n for j in keep}
        kept_rows = sorted(row_of[i] for i in still)
        if step == 0:  # decode writes into preallocated buffers from here on
            rows = None if len(still) == len(alive_items) else torch.tensor(kept_rows, dtype=torch.long)
            cache, order = reserve(cache, k * max_new_tokens, rows=rows), kept_rows
        elif len(still) < len(alive_items):
            order = drop_rows(cache, kept_rows) if IN_PLACE_DROP else _fork_rows(cache, kept_rows)
            if not IN_PLACE_DROP:
                cache, order = order
        if len(still) < len(alive_items):
            # row r now holds the prompt of old row order[r]
            item_at = {row_of[i]: i for i in alive_items}
            base = base.index_select(0, torch.tensor(order, dtype=torch.long, device=dev))
            alive_items = [item_at[o] for o in order]
            row_of = [-1] * n
            for r, i in enumerate(alive_items):
                row_of[i] = r
        r_n = len(alive_items)
        inp = torch.full((r_n, k), pad, dtype=torch.long)
        for j in keep:
            v = active[j]
            inp[row_of[v % n], v // n] = nxt_list[j]
        pos = torch.tensor([[n_prompt[i] + step] * k for i in alive_items], dtype=torch.long)
        allowed = torch.cat([base[:, None, :].expand(r_n, k, base.shape[1]),
                             own.repeat(1, step + 1)[None].expand(r_n, k, k * (step + 1))], dim=2)
        active = [active[j] for j in keep]
        rows = torch.tensor([row_of[v % n] for v in active], dtype=torch.long, device=dev)
        cols = torch.tensor([v // n for v in active], dtype=torch.long, device=dev)
        # logits of the running seeds only (finished seeds' dummy columns are not projected)
        cur = forward(lm, inp.to(dev), attention_mask_4d(lm, allowed).to(dev), pos.to(dev), cache,
                      prefix=prefix, select=(rows, cols))
    return out.generations([n_prompt[v % n] for v in range(n * k)])


def generate_multi_seed(lm, prompts: list[str], seeds: list[int], *, max_new_tokens: int,
                        temperature: float, top_p: float = 1.0, batch_size: int = 16,
                        progress=None, prefix_cache: bool = True,
                        seed_columns: bool = True,
                        store: PrefillStore | None = None,
                        window_full: bool = True,
                        record: BatchRecord | None = None) -> dict[int, list[Generation]]:
    """Generate ``prompts`` once per seed, prefilling each batch ONCE and decoding all seeds
    together (:func:`generate_streams`, one stream per seed). ``{seed: [Generation in input
    order]}``; in fp32 identical to ``{s: generate(..., seed=s)}`` (tested); in bf16/NF4
    compute the different summation order of a batched forward can flip a sampled token,
    while a rerun of the same call is always identical. Greedy (temperature 0) decodes once
    and returns the same generations under every seed."""
    seeds = list(dict.fromkeys(int(s) for s in seeds))
    if not seeds:
        raise ValueError("generate_multi_seed: no seeds")
    greedy = float(temperature) == 0.0
    decode_seeds = seeds[:1] if greedy else seeds
    outs = generate_streams(lm, prompts, [Stream(float(temperature), float(top_p), s) for s in decode_seeds],
                            max_new_tokens=max_new_tokens, batch_size=batch_size, progress=progress,
                            prefix_cache=prefix_cache, seed_columns=seed_columns, store=store,
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
                     seed_columns: bool = True, store: PrefillStore | None = None,
                     window_full: bool = True,
                     record: BatchRecord | None = None,
                     budget: MemoryBudget | None = None) -> list[list[Generation]]:
    """Decode every prompt under each of ``streams`` (greedy and sampled ones may mix),
    prefilling each batch ONCE and decoding all streams of the batch in one forward per step;
    returns one list of generations (input order) per stream. Each (stream, prompt) keeps its
    own generator, so in fp32 a stream's outputs equal a separate call's (tested).

    With ``seed_columns`` (where the model takes a 4D mask and has no sliding-window layers),
    the streams of a prompt decode as columns of one cache row (:func:`_decode_seed_columns`)
    instead of one repeated cache row per stream (same outputs in fp32); with repeated rows,
    the streams of one temperature and top_p decode together, one kind after another from
    the same prefill.

    ``store``: prefixes and batch prefills computed by earlier calls on this model are reused
    (:class:`.kvcache.PrefillStore`; the same outputs as computing them afresh).

    ``window_full``: on a model with sliding-window layers, a call whose longest prompt plus
    ``max_new_tokens`` fits in the window runs them as full attention
    (:func:`.kvcache.window_as_full`; same outputs up to summation order, tested).

    Batches hold at most ``batch_size`` prompts and, within that, as many as fit the memory
    ``budget`` by their estimated footprint (:mod:`.memory`; default: the budget of ``lm``'s
    device with the ``store``'s byte budget set aside). ``record``: a
    :class:`.batching.BatchRecord` that receives the plan and every out-of-memory split (a
    batch that did not fit is halved and retried, :func:`.batching.run_with_oom_fallback`)."""
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
    # window: then it gets packed prefill, the detached prefix and seed columns too.
    within = window_as_full(lm, max(len(e) for e in enc) + max_new_tokens) if window_full \
        else contextlib.nullcontext(False)
    try:
        with torch.inference_mode(), within:
            prefix = build_prefix(lm, enc, enabled=prefix_cache, store=store)
            columns = seed_columns and k > 1 and packed_prefill_supported(lm)

            def run(rows: list[int]) -> dict:
                t0 = time.perf_counter()
                cache, mask, logits = prefill(lm, prefix, [enc[i] for i in rows], store=store)
                t_pre = time.perf_counter() - t0
                # All streams decode together, stream-major (row s * n + j = stream s of
                # prompt j): either as columns of one cache row per prompt (the prompt's
                # keys/values stored and read once), or with the prefilled rows repeated once
                # per stream. Either way each decode step is one forward for all streams.
                n = len(rows)
                t1 = time.perf_counter()
                row_prompts = [prompts[i] for i in rows]
                # Columns pay for masked-out keys (the other streams' tokens) to store and read
                # each prompt's own columns once; with the shared prefix detached (read once
                # anyway) they measured as fast as rows or faster on every sampled cell kind
                # (benchmarks/bench_seed_columns.py), so they are used wherever supported.
                if k > 1 and columns:
                    gens = _decode_seed_columns(lm, cache, mask, logits,
                                                _Sampler.for_streams(streams, row_prompts), n_seeds=k,
                                                max_new_tokens=max_new_tokens,
                                                n_prompt=[len(enc[i]) for i in rows], t0=t1,
                                                prefix=prefix)
                elif k > 1:
                    # Repeated rows: each row holds its own copy of its prompt, so one decode of
                    # every stream would read ``k`` copies per step; streams of the same
                    # temperature and top_p decode together, kinds one after another from the
                    # same prefill (measured on Gemma's five-shot T4 BBQ cell: 0.81x when all
                    # 11 streams decoded as one batch of repeated rows).
                    gens = [None] * (n * k)
                    kinds: dict[tuple, list[int]] = {}
                    for si, st in enumerate(streams):
                        kinds.setdefault((st.temperature, st.top_p), []).append(si)
                    for members in kinds.values():
                        rep = torch.arange(n, device=mask.device).repeat(len(members))
                        c, m, lg = fork_cache(cache, rows=rep), mask.index_select(0, rep), logits.index_select(0, rep)
                        sub = _Sampler.for_streams([streams[si] for si in members], row_prompts)
                        part = _decode(lm, c, m, lg, sub, max_new_tokens=max_new_tokens,
                                       n_prompt=[len(enc[i]) for i in rows] * len(members),
                                       t0=time.perf_counter(), prefix=prefix)
                        for mi, si in enumerate(members):
                            gens[si * n:(si + 1) * n] = part[mi * n:(mi + 1) * n]
                else:
                    gens = _decode(lm, cache, mask, logits, _Sampler.for_streams(streams, row_prompts),
                                   max_new_tokens=max_new_tokens,
                                   n_prompt=[len(enc[i]) for i in rows], t0=t1, prefix=prefix)
                for g in gens:
                    g.latency_s = round(g.latency_s + t_pre, 6)
                bar.update(n * k)
                return {i: [gens[s * n + j] for s in range(k)] for j, i in enumerate(rows)}

            dims = ModelDims.of(lm)
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
                                            largest_kind=max(kinds.values()))

            plan = plan_batches([len(e) - len(prefix) for e in enc], batch_size, footprint,
                                budget.budget_bytes)
            if record is not None:
                record.plans.append({
                    "what": "generation", "budget": budget.record(), "streams": k,
                    "stream_columns": bool(columns), "prefix_tokens": len(prefix),
                    "max_new_tokens": max_new_tokens, "batch_size_cap": batch_size,
                    "batches": [{"prompts": len(b), "longest": max(len(enc[i]) for i in b),
                                 "footprint_bytes": f} for b, f in plan]})
            for rows, _ in plan:
                done = run_with_oom_fallback(rows, run, what="generation", device=lm.info["device"],
                                             n_tokens=lambda rs: sum(len(enc[i]) for i in rs),
                                             splits=record.splits if record is not None else None,
                                             on_oom=(lambda: store.discard("batch")) if store is not None else None)
                for i, per_stream in done.items():
                    for s, g in enumerate(per_stream):
                        results[s][i] = g
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
