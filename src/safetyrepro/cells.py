"""Run one cell: (model, benchmark, config, seed) of a variant over the benchmark's fixed item
subset, written as one shard (:mod:`.shards`).

    items + few-shot pool --requests.cell_requests--> model requests
        --inference (generate streams / score candidates)--> outputs
        --task.score_*--> rows --shards.write_shard--> shard

The same :func:`run_cell` runs in-process (`safetyrepro run-cell`) or inside the persistent
model worker, whose state is a :class:`CellWorker`: the loaded model, its prefill store, the
decode groups still being handed out, and the config and item files it has read. Free-form
cells of one decode group share their prompts: the worker generates all the group's streams
in one pass (one prefill, one batch) and keeps the other cells' outputs until their jobs ask.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from .config import RunConfig, load_config
from .errors import CellError, SafetyReproError
from .grid import Config
from .hashing import canonical_hash, text_hash
from .provenance import code_version
from .requests import FreeformRequests, LogprobRequests, cell_requests
from .shards import ShardMeta, read_shard, write_shard

PENDING_GROUPS_MAX = 4096  # decode groups with sequences still to hand out (outputs are small text)


@dataclass(frozen=True)
class CellSpec:
    model: str
    benchmark: str
    config_id: str
    seed: int
    variant: str
    quantization: str

    @property
    def id(self) -> str:
        return f"{self.model}/{self.benchmark}/{self.config_id}/s{self.seed} ({self.variant}, {self.quantization})"


def group_streams(group, levels) -> tuple[list, list[list[tuple[str, int]]]]:
    """The streams a decode group ``[(decoding, n_seeds), ...]`` generates and, per stream,
    the (decoding, seed) cells it serves: one stream per seed of a sampled decoding, one
    greedy stream for every seed of a greedy one. ``levels``: decoding -> its rules level."""
    from .inference import Stream

    streams, owners = [], []
    for d, n_seeds in group:
        lv = levels[d]
        if lv["sampled"]:
            for s in range(n_seeds):
                streams.append(Stream(lv["temperature"], lv.get("top_p", 1.0), s))
                owners.append([(d, s)])
        else:  # one greedy decode serves every seed
            streams.append(Stream(0.0, lv.get("top_p", 1.0), 0))
            owners.append([(d, s) for s in range(n_seeds)])
    return streams, owners


class CellWorker:
    """What a process serving cells keeps between cells: the loaded model (``lm``), its
    prefill store, the decode groups with outputs still to hand out, and the run configs and
    item files it has read (keyed by path and modification time, so an edited file is read
    again)."""

    def __init__(self, lm=None):
        self.lm = lm
        self.loaded_code: str | None = None  # inference-code hash at load (see load)
        self._configs: dict[tuple[str, float], RunConfig] = {}
        self._items: dict[tuple[str, float], tuple[list[dict], dict]] = {}
        # decode group key -> (outputs still to hand out, the group's BatchRecord)
        self._pending: dict[tuple, tuple[dict[tuple[str, int], list], object]] = {}
        self._prefills = None

    @classmethod
    def load(cls, config: str, model: str, quantization: str | None = None) -> "CellWorker":
        """Load the model once (the worker's loader).

        The worker computes every cell job of its model on this node, so it runs
        :func:`.models.load.compute_threads` threads (``runtime.threads``, default: every core
        this process may use), not the one-thread limit (``OMP_NUM_THREADS=1`` and friends)
        that Snakemake sets for each single-core job and that the worker inherits from the
        client that started it (measured: the worker then used one of this machine's two
        cores)."""
        import torch

        from . import inference  # noqa: F401 - import the code the hash below covers, now
        from .inference import (attention, backend, batching, cache, capabilities,  # noqa: F401
                                decode, encoding, generate, memory, packing, prefill, sampling,
                                scoring, store)
        from .models import load_model
        from .models.load import compute_threads
        from .plan import Plan

        worker = cls()
        cfg = worker.config(config)
        # The inference code this worker runs is the code it imported now: its hash is taken
        # now, not from the disk at the end of a call (which may hold an edit made since).
        worker.loaded_code = Plan(cfg).inference_code
        torch.set_num_threads(compute_threads(cfg))
        worker.lm = load_model(cfg, model, quantization=quantization)
        return worker

    # ---- files read once per version ------------------------------------------------------
    def config(self, path: str) -> RunConfig:
        key = (str(path), Path(path).stat().st_mtime)
        if key not in self._configs:
            self._configs[key] = load_config(path)
        return self._configs[key]

    def items(self, path: Path) -> tuple[list[dict], dict]:
        from .items import read_items

        if not path.exists():
            raise CellError(f"item file {path} is missing; run `safetyrepro items` (or the workflow) first")
        key = (str(path), path.stat().st_mtime)
        if key not in self._items:
            df, meta = read_items(path)
            self._items[key] = (df.to_dict(orient="records"), meta)
        return self._items[key]

    # ---- the model and its stores ---------------------------------------------------------
    def model(self, cfg: RunConfig, spec: CellSpec):
        """The loaded model, loading it on first use; a worker holding another model or
        quantization refuses the cell."""
        if self.lm is None:
            from .models import load_model

            self.lm = load_model(cfg, spec.model, quantization=spec.quantization)
        held = (self.lm.info.get("model_key", spec.model), self.lm.info.get("quantization", spec.quantization))
        if held != (spec.model, spec.quantization):
            raise CellError(f"cell {spec.id}: this worker holds {held[0]} ({held[1]})")
        return self.lm

    def prefills(self, cfg: RunConfig):
        """The model's :class:`~.inference.store.PrefillStore`: free-form and logprob cells of
        one (template, shots) often share the few-shot prefix and prompts; each prefill is
        computed once per worker (same outputs). Its budget is ``runtime.prefill_store_mb``
        (default 2048; the prefills live where the model runs, so on a GPU this is GPU memory;
        0 turns it off)."""
        from .inference.store import PrefillStore

        budget = int(cfg.section("runtime")["prefill_store_mb"]) << 20  # default: config.DEFAULTS
        if self._prefills is None or self._prefills.max_bytes != budget:
            self._prefills = PrefillStore(budget)
        return self._prefills

    def group_generations(self, cfg: RunConfig, spec: CellSpec, decoding: str, req: FreeformRequests,
                          group, progress: bool, batching) -> list:
        """Generations of one (decoding, seed) of a free-form cell's decode group
        (:meth:`.plan.Plan.decode_group`: the greedy, T=0.3 and T=0.7 decodings of one template
        and shots, with all their seeds). The whole group is generated in one pass (one
        prefill, all its sequences decoded in one batch, :func:`.inference.generate_streams`)
        the first time any of its cells is asked for; the others wait in memory until their
        jobs come, in whatever order the scheduler sends them. A (decoding, seed) is handed out
        once; asking again (a rerun) generates the group afresh, with the same result, since
        each sequence drives its own generator and the batch is the same. What the engine
        recorded about the group's batches (plans, out-of-memory splits; kept with the pending
        outputs) is added to ``batching`` (a :class:`.inference.batching.BatchRecord`) of every
        cell the group serves."""
        from .inference.backend import EngineBackend
        from .inference.batching import BatchRecord
        from .inference.generate import copy_generations

        # the prompts identify the template, shots and items; the rest the generation settings
        # and the levels of every decoding of the group (temperature, top_p, ...) and the rules stamp
        levels = {d: cfg.rules.level("decoding", d) for d, _ in group}
        key = (spec.model, spec.quantization, spec.benchmark, canonical_hash(req.prompts),
               req.max_new_tokens, req.batch_size, tuple(group),
               canonical_hash({d: levels[d] for d, _ in group}), cfg.rules.stamp)
        pending, record = self._pending.get(key, (None, None))
        if pending is None or (decoding, spec.seed) not in pending:
            streams, owners = group_streams(group, levels)
            record = BatchRecord()
            outs = EngineBackend(self.lm, self.prefills(cfg)).generate_streams(
                req.prompts, streams, max_new_tokens=req.max_new_tokens, batch_size=req.batch_size,
                progress=progress, record=record)
            pending = {}
            for out, who in zip(outs, owners):
                for j, ds in enumerate(who):
                    pending[ds] = out if j == 0 else copy_generations(out)
            self._pending[key] = (pending, record)
            while len(self._pending) > PENDING_GROUPS_MAX:  # oldest first
                self._pending.pop(next(iter(self._pending)))
        gens = pending.pop((decoding, spec.seed))
        if not pending:
            del self._pending[key]
        batching.splits.extend(record.splits)
        batching.plans.extend(record.plans)
        return gens


# ---- the worker entry points (see cell_client) ----------------------------------------------
def load_for_worker(config: str, model: str, quantization: str | None = None) -> CellWorker:
    return CellWorker.load(config, model, quantization)


class StaleWorkerError(CellError):
    """The job's cell fingerprint differs from the one this worker computes from the code,
    config, rules and task files it has loaded: it would compute the cell under stale
    settings. The worker exits (``worker_fatal``) and the client retries once on a fresh
    worker (``worker_stale``)."""

    worker_fatal = True
    worker_stale = True


def run_cell_in_worker(worker: CellWorker, **kwargs) -> dict:
    return run_cell(worker=worker, **kwargs)


# ---- the cell -------------------------------------------------------------------------------
def resolve_cell(cfg: RunConfig, plan, model: str, benchmark: str, cell: str, seed: int, variant: str,
                 quantization: str | None) -> tuple[CellSpec, Config]:
    """The cell's spec and its config (the plan's :class:`Config` of the id ``cell``), checked
    against the plan and the rules."""
    from .plan import SHARD_ROOTS

    name = f"{model}/{benchmark}/{cell}/s{seed}"
    if variant not in SHARD_ROOTS:
        raise CellError(f"cell {name}: unknown variant {variant!r} (expected one of {sorted(SHARD_ROOTS)})")
    quant = plan.quantization(model, variant)
    if quantization is not None and quantization != quant:
        raise CellError(f"cell {name}: quantization {quantization!r} given, but {cfg.path} runs "
                        f"variant {variant!r} of {model} as {quant!r}")
    spec = CellSpec(model, benchmark, cell, int(seed), variant, quant)
    try:
        c = plan.config(cell)
    except ValueError as exc:
        raise CellError(f"cell {spec.id}: {exc}") from exc
    violations = cfg.rules.violations(benchmark, c.levels())
    if violations:
        raise CellError(f"cell {spec.id} is not valid under the rules ({', '.join(violations)})")
    if int(seed) >= cfg.n_seeds(c.decoding):
        raise CellError(f"cell {spec.id}: seed {seed} out of range (decoding {c.decoding} runs "
                        f"{cfg.n_seeds(c.decoding)} seed(s))")
    return spec, c


def run_cell(*, config: str, model: str, benchmark: str, cell: str, seed: int, out: str,
             variant: str = "main", items: str | None = None, fewshot: str | None = None,
             quantization: str | None = None, worker: CellWorker | None = None,
             progress: bool = True, fingerprint: str | None = None) -> dict:
    """Run one cell of ``variant`` and write its shard atomically to ``out``. ``items`` /
    ``fewshot``: the item subset and few-shot pool files (default: the plan's);
    ``quantization``, when given, must be the one the plan gives the variant; ``worker``: the
    state kept between cells (default: a fresh one, which loads the model); ``fingerprint``,
    when given (the workflow's cell fingerprint, planned without the chat-template hash), must
    be the one computed here from the loaded code and data, else :class:`StaleWorkerError`.
    Returns a small summary."""
    from .plan import Plan
    from .tasks import load_task

    worker = worker if worker is not None else CellWorker()
    cfg = worker.config(config)
    plan = Plan(cfg)
    if worker.loaded_code is not None:
        plan.__dict__["inference_code"] = worker.loaded_code  # the cached_property, as loaded
    if worker.lm is not None:
        plan.use_loaded_weights(model, worker.lm.info)  # the weights it holds, not the folder's now
    spec, c = resolve_cell(cfg, plan, model, benchmark, cell, seed, variant, quantization)
    if fingerprint is not None:
        planned = plan.cell_fingerprint(model, benchmark, cell, int(seed), variant, chat_template=False)
        if fingerprint != planned:
            raise StaleWorkerError(
                f"cell {spec.id}: the job's fingerprint {fingerprint[:12]} differs from "
                f"{planned[:12]}, computed from the code, config ({config}), rules, task files and "
                "model weights this process has loaded (one of them changed since it loaded them, or "
                "since the workflow planned the job); nothing was computed")
    item_rows, items_meta = worker.items(Path(items) if items else plan.items_path(benchmark))
    pool, pool_meta = worker.items(Path(fewshot) if fewshot else plan.fewshot_path(benchmark))
    task = load_task(benchmark)
    lm = worker.model(cfg, spec)
    plan.use_loaded_weights(model, lm.info)  # the shard's fingerprint names the weights it used
    prepared = plan.chat_template_hash(model)
    if prepared is not None and prepared != lm.info.get("chat_template_hash"):
        raise CellError(f"cell {spec.id}: the model's chat template (hash "
                        f"{lm.info.get('chat_template_hash')}) is not the one its prepare step recorded "
                        f"in {plan.model_marker(model)} ({prepared}); prepare the model again")
    group = plan.decode_group(benchmark, cell, variant)
    cell_fp = plan.cell_fingerprint(model, benchmark, cell, int(seed), variant)

    from .inference.batching import BatchRecord

    t0 = time.perf_counter()
    batching = BatchRecord()  # the engine's batch plans and out-of-memory splits for this cell
    try:
        req = cell_requests(cfg, lm.tokenizer, task, c, item_rows, pool)
        if isinstance(req, FreeformRequests):
            from .inference.generate import NonFiniteLogits

            try:
                gens = worker.group_generations(cfg, spec, c.decoding, req, group, progress, batching)
            except NonFiniteLogits as exc:
                item = next((it["item_id"] for it, p in zip(item_rows, req.prompts) if p == exc.prompt), "?")
                raise CellError(f"item {item}: {exc}") from exc
            rows = freeform_rows(task, item_rows, req, gens)
        else:
            rows = logprob_rows(lm, task, item_rows, req, worker.prefills(cfg), progress, batching)
    except SafetyReproError as exc:
        raise CellError(f"cell {spec.id}: {exc}") from exc
    except Exception as exc:  # OOM and friends: name the cell
        if "out of memory" in str(exc).lower():
            raise CellError(f"cell {spec.id}: out of memory ({exc}); lower generation.batch_size") from exc
        raise
    wall = time.perf_counter() - t0

    dec = cfg.rules.level("decoding", c.decoding)
    exemplars = pool[: cfg.rules.level("shots", c.shots)["n"]]
    meta = ShardMeta(
        cell=cell, model=model, benchmark=benchmark, seed=int(seed), variant=variant,
        template=c.template, decoding=c.decoding, shots=c.shots, scoring=c.scoring,
        temperature=dec["temperature"], top_p=dec.get("top_p", 1.0),
        max_new_tokens=req.max_new_tokens if isinstance(req, FreeformRequests) else None,
        decode_group=[list(g) for g in group],
        template_hash=task.template_hash(c.template),
        chat_template_hash=lm.info.get("chat_template_hash"), rules_stamp=cfg.rules.stamp, config_hash=cfg.hash,
        subset_hash=items_meta.get("subset_hash"), items_content_hash=items_meta.get("content_hash"),
        fewshot_ids=[x["item_id"] for x in exemplars],
        fewshot_hash=pool_meta.get("subset_hash"),
        fingerprint=cell_fp,
        parser_version=task.parser_version, model_info=dict(lm.info),
        quantization=lm.info.get("quantization", spec.quantization), device=lm.info.get("device"),
        batching=batching.as_dict(), code_version=code_version(), n_items=len(rows), wall_s=wall,
    )
    write_shard(out, rows, meta)
    _, back = read_shard(out)   # it reads back, whole, before the job reports success
    if back.fingerprint != cell_fp:
        from .errors import ShardError

        raise ShardError(f"{out}: read back with fingerprint {back.fingerprint}, "
                         f"expected {cell_fp} (another writer replaced it?)")
    return summary(out, rows, wall)


def freeform_rows(task, items: list[dict], req: FreeformRequests, gens: list) -> list[dict]:
    rows = []
    for it, prompt, g in zip(items, req.prompts, gens):
        r = task.score_freeform(it, g.text)
        rows.append({
            "item_id": it["item_id"], "prompt_hash": text_hash(prompt), "prompt": prompt,
            "raw_output": g.text, "parsed_label": r.parsed_label, "parse_ok": bool(r.parse_ok),
            "correct": bool(r.correct), "cand_logliks": None, "cand_ntokens": None, "chosen_index": None,
            "n_prompt_tokens": g.n_prompt_tokens, "n_gen_tokens": g.n_gen_tokens,
            "finish_reason": g.finish_reason, "latency_s": g.latency_s,
        })
    return rows


def logprob_rows(lm, task, items: list[dict], req: LogprobRequests, store, progress: bool,
                 batching) -> list[dict]:
    """Rows of a logprob cell; ``batching``: a :class:`.inference.batching.BatchRecord` that
    receives the engine's batch plans and out-of-memory splits."""
    from .inference.backend import EngineBackend

    t0 = time.perf_counter()
    scores = EngineBackend(lm, store).score_candidates(req.contexts, req.candidates,
                                                       batch_size=req.batch_size, progress=progress,
                                                       record=batching)
    per_item = (time.perf_counter() - t0) / max(len(items), 1)
    rows = []
    for it, ctx, sc in zip(items, req.contexts, scores):
        lls = [s.loglik for s in sc]
        nt = [s.n_tokens for s in sc]
        r = task.score_logprob(it, lls, nt)
        rows.append({
            "item_id": it["item_id"], "prompt_hash": text_hash(ctx), "prompt": ctx, "raw_output": None,
            "parsed_label": r.parsed_label, "parse_ok": True, "correct": bool(r.correct),
            "cand_logliks": lls, "cand_ntokens": nt, "chosen_index": r.chosen_index,
            "n_prompt_tokens": len(lm.tokenizer(ctx)["input_ids"]), "n_gen_tokens": 0,
            "finish_reason": None, "latency_s": per_item,
        })
    return rows


def summary(out, rows: list[dict], wall: float) -> dict:
    import resource

    return {"out": str(out), "n_items": len(rows), "wall_s": wall,
            "accuracy": sum(r["correct"] for r in rows) / max(len(rows), 1),
            "tokens": sum((r["n_prompt_tokens"] or 0) + (r["n_gen_tokens"] or 0) for r in rows),
            "generated_tokens": sum(r["n_gen_tokens"] or 0 for r in rows),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
