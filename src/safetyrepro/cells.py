"""Run one cell: (model, benchmark, config, seed) of a variant over the benchmark's fixed item
subset, written as one shard (:mod:`.shards`).

    items + few-shot pool --requests.cell_requests--> model requests
        --inference (generate streams / score candidates)--> outputs
        --task.score_*--> rows --shards.write_shard--> shard

:func:`run_cell` takes a resolved :class:`.cell_request.CellRequest` (built once, by the cell
job's client or :meth:`.plan.Plan.cell_request`) and opens exactly the files it names. It runs
in-process (`safetyrepro run-cell`) or inside the persistent model worker, whose state is a
:class:`ModelCellRunner`: the model's backend (:mod:`.inference.backend`), its prefill store,
the decode groups still being handed out, and the config and item files it has read.
Free-form cells of one decode group share their prompts: the runner generates all the group's
streams in one pass (one prefill, one batch) and keeps the other cells' outputs until their
jobs ask.
"""

from __future__ import annotations

import time
from pathlib import Path

from .cell_request import CellRequest
from .compute_dtype import compute_dtype
from .config import RunConfig, load_config
from .errors import CellError, SafetyReproError
from .grid import Config
from .hashing import canonical_hash, text_hash
from .models.packed_linear import resolve as resolve_linear
from .provenance import code_version
from .requests import FreeformRequests, LogprobRequests, cell_requests
from .shards import ShardMeta, read_shard, write_shard

PENDING_GROUPS_MAX = 4096  # decode groups with sequences still to hand out (outputs are small text)


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


class ModelCellRunner:
    """The model's cell runner: what a process serving one model's cells keeps between cells.
    The model (``lm``, loaded on first use, run by this engine) or another ``backend`` (a
    :class:`.inference.backend.ModelBackend`, e.g. the fake one), the model's prefill store,
    the decode groups with outputs still to hand out, and the run configs and item files it
    has read (keyed by path and modification time, so an edited file is read again).
    ``loaded_code``: the inference-code hash of the code this process imported when it loaded
    the model (None: hashed from the disk at each cell)."""

    def __init__(self, lm=None, *, backend=None, loaded_code: str | None = None):
        if lm is not None and backend is not None:
            raise ValueError("a runner holds a loaded model or a backend, not both")
        self.lm = lm
        self._backend = backend
        self.loaded_code = loaded_code
        self._configs: dict[tuple[str, float], RunConfig] = {}
        self._items: dict[tuple[str, float], tuple[list[dict], dict]] = {}
        # decode group key -> (outputs still to hand out, the group's BatchRecord)
        self._pending: dict[tuple, tuple[dict[tuple[str, int], list], object]] = {}
        self._prefills = None

    @classmethod
    def load(cls, config_path: str, model: str, quantization: str | None = None) -> "ModelCellRunner":
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
        from .fingerprints import inference_code
        from .inference.backend import FakeBackend

        # The inference code this worker runs is the code it imported now: its hash is taken
        # now, not from the disk at the end of a call (which may hold an edit made since).
        runner = cls(loaded_code=inference_code())
        cfg = runner.run_config(config_path)
        if cfg.model(model)["source"]["kind"] == "fake":   # no model: the workflow on a stand-in
            runner._backend = FakeBackend(model, quantization or cfg.quantization(model))
            return runner
        torch.set_num_threads(compute_threads(cfg))
        runner.lm = load_model(cfg, model, quantization=quantization)
        return runner

    def code(self) -> str:
        """The inference-code hash of the code computing this runner's cells."""
        if self.loaded_code is not None:
            return self.loaded_code
        from .fingerprints import inference_code

        return inference_code()

    # ---- files read once per version ------------------------------------------------------
    def run_config(self, path: str) -> RunConfig:
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
    def backend(self, cfg: RunConfig, request: CellRequest):
        """The model's backend, loading the model on first use; a runner holding another
        model or quantization refuses the cell."""
        if self._backend is not None:
            backend = self._backend
        else:
            from .inference.backend import EngineBackend

            if self.lm is None:
                from .models import load_model

                self.lm = load_model(cfg, request.model, quantization=request.quantization)
            backend = EngineBackend(self.lm, self.prefills(cfg))
        info = backend.info
        held = (info.get("model_key", request.model), info.get("quantization", request.quantization))
        if held != (request.model, request.quantization):
            raise CellError(f"cell {request.id}: this worker holds {held[0]} ({held[1]})")
        return backend

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

    def group_generations(self, cfg: RunConfig, request: CellRequest, backend, decoding: str,
                          req: FreeformRequests, progress: bool, batching) -> list:
        """Generations of one (decoding, seed) of a free-form cell's decode group
        (``request.decode_group``: the greedy, T=0.3 and T=0.7 decodings of one template and
        shots, with all their seeds). The whole group is generated in one pass (one prefill,
        all its sequences decoded in one batch, :func:`.inference.generate_streams`) the first
        time any of its cells is asked for; the others wait in memory until their jobs come,
        in whatever order the scheduler sends them. A (decoding, seed) is handed out once;
        asking again (a rerun) generates the group afresh, with the same result, since each
        sequence drives its own generator and the batch is the same. What the engine recorded
        about the group's batches (plans, out-of-memory splits, what its decode forwards computed;
        kept with the pending outputs) is added to ``batching`` (a
        :class:`.inference.batching.BatchRecord`) of every cell the group serves."""
        from .inference.batching import BatchRecord
        from .inference.generate import copy_generations

        group = request.decode_group
        # the prompts identify the template, shots and items; the rest the generation settings
        # and the levels of every decoding of the group (temperature, top_p, ...) and the rules stamp
        levels = {d: cfg.rules.level("decoding", d) for d, _ in group}
        key = (request.model, request.quantization, request.benchmark, canonical_hash(req.prompts),
               req.max_new_tokens, req.batch_size, tuple(group),
               canonical_hash({d: levels[d] for d, _ in group}), cfg.rules.stamp)
        pending, record = self._pending.get(key, (None, None))
        if pending is None or (decoding, request.seed) not in pending:
            streams, owners = group_streams(group, levels)
            record = BatchRecord()
            outs = backend.generate_streams(
                req.prompts, streams, max_new_tokens=req.max_new_tokens, batch_size=req.batch_size,
                progress=progress, record=record)
            pending = {}
            for out, who in zip(outs, owners):
                for j, ds in enumerate(who):
                    pending[ds] = out if j == 0 else copy_generations(out)
            self._pending[key] = (pending, record)
            while len(self._pending) > PENDING_GROUPS_MAX:  # oldest first
                self._pending.pop(next(iter(self._pending)))
        gens = pending.pop((decoding, request.seed))
        if not pending:
            del self._pending[key]
        batching.splits.extend(record.splits)
        batching.plans.extend(record.plans)
        batching.decode.extend(record.decode)
        return gens


# ---- the worker entry points (see cell_client) ----------------------------------------------
def load_runner(config_path: str, model: str, quantization: str | None = None) -> ModelCellRunner:
    return ModelCellRunner.load(config_path, model, quantization)


class StaleWorkerError(CellError):
    """The job's cell fingerprint differs from the one this worker computes from the code,
    config, rules and task files it has loaded: it would compute the cell under stale
    settings. The worker exits (``worker_fatal``) and the client retries once on a fresh
    worker (``worker_stale``)."""

    worker_fatal = True
    worker_stale = True


def run_cell_in_worker(runner: ModelCellRunner, request: dict) -> dict:
    """The worker's call target: ``request`` is a :meth:`.CellRequest.as_message`."""
    try:
        parsed = CellRequest.from_message(request)
    except ValueError as exc:
        raise CellError(str(exc)) from exc
    return run_cell(parsed, runner)


# ---- the cell -------------------------------------------------------------------------------
def resolve_cell(cfg: RunConfig, request: CellRequest) -> Config:
    """The request's :class:`Config` (its id looked up in the rules), checked against the run
    config, the rules and its decode group."""
    from .grid import config_of
    from .plan import variant_quantization
    from .results_layout import SHARD_ROOTS

    if request.variant not in SHARD_ROOTS:
        raise CellError(f"cell {request.id}: unknown variant {request.variant!r} "
                        f"(expected one of {sorted(SHARD_ROOTS)})")
    if Path(cfg.rules.path).resolve() != Path(request.rules).resolve():
        raise CellError(f"cell {request.id}: the job declares the rules file {request.rules}, but "
                        f"{cfg.path} reads {cfg.rules.path}")
    quant = variant_quantization(cfg, request.model, request.variant)
    if request.quantization != quant:
        raise CellError(f"cell {request.id}: quantization {request.quantization!r} given, but {cfg.path} "
                        f"runs variant {request.variant!r} of {request.model} as {quant!r}")
    try:
        c = config_of(cfg.rules, request.config_id)
    except ValueError as exc:
        raise CellError(f"cell {request.id}: {exc}") from exc
    violations = cfg.rules.violations(request.benchmark, c.levels())
    if violations:
        raise CellError(f"cell {request.id} is not valid under the rules ({', '.join(violations)})")
    n_seeds = dict(request.decode_group).get(c.decoding)
    if n_seeds is None:
        raise CellError(f"cell {request.id}: its decode group {list(request.decode_group)} lacks "
                        f"its decoding {c.decoding}")
    if request.seed >= n_seeds:
        raise CellError(f"cell {request.id}: seed {request.seed} out of range (decoding {c.decoding} "
                        f"runs {n_seeds} seed(s))")
    return c


def run_cell(request: CellRequest, runner: ModelCellRunner | None = None, *, progress: bool = True) -> dict:
    """Run the resolved cell ``request`` and write its shard atomically to ``request.out``.
    Opens only the files the request names (run config, rules, items, few-shot pool, model
    marker). ``runner``: the state kept between cells (default: a fresh one, which loads the
    model). When ``request.fingerprint`` is given (the workflow's, planned without the
    chat-template hash) it must be the one computed here from the loaded code, weights, task
    files and settings, else :class:`StaleWorkerError`. Returns a small summary."""
    from .fingerprints import cell_fingerprint, cell_fingerprint_fields, loaded_weights_identity, marker_chat_template_hash
    from .tasks import load_task

    runner = runner if runner is not None else ModelCellRunner()
    cfg = runner.run_config(request.config_path)
    c = resolve_cell(cfg, request)
    task = load_task(request.benchmark)
    backend = runner.backend(cfg, request)
    info = backend.info
    runtime = cfg.section("runtime")
    compute = info.get("compute_dtype") or compute_dtype(runtime["cpu_compute_dtype"], info.get("device", "cpu"),
                                                         request.quantization)
    fields = cell_fingerprint_fields(
        cfg, request.model, request.quantization, request.benchmark, c, request.seed, request.decode_group,
        template_hash=task.template_hash(c.template), weights=loaded_weights_identity(cfg, request.model, info),
        code=runner.code(), compute=compute,
        linear=info.get("linear") or resolve_linear(runtime["cpu_linear"], info.get("device", "cpu"), compute))
    if request.fingerprint is not None:
        planned = cell_fingerprint(fields)
        if request.fingerprint != planned:
            raise StaleWorkerError(
                f"cell {request.id}: the job's fingerprint {request.fingerprint[:12]} differs from "
                f"{planned[:12]}, computed from the code, config ({request.config_path}), rules, task "
                f"files, model weights, compute dtype ({fields['compute_dtype']}) and linear path "
                f"({fields['linear']}) this process has "
                "loaded (one of them changed since it loaded them, or since the workflow planned the job; "
                "with runtime.cpu_compute_dtype: auto, a node whose CPU resolves it otherwise than the "
                "planning host: set it explicitly); nothing was computed")
    item_rows, items_meta = runner.items(Path(request.items))
    pool, pool_meta = runner.items(Path(request.fewshot))
    prepared = marker_chat_template_hash(request.model_marker, request.model)
    if prepared is not None and prepared != info.get("chat_template_hash"):
        raise CellError(f"cell {request.id}: the model's chat template (hash "
                        f"{info.get('chat_template_hash')}) is not the one its prepare step recorded "
                        f"in {request.model_marker} ({prepared}); prepare the model again")
    cell_fp = cell_fingerprint(fields, prepared)

    from .inference.batching import BatchRecord

    t0 = time.perf_counter()
    batching = BatchRecord()  # the engine's batch plans and out-of-memory splits for this cell
    try:
        req = cell_requests(cfg, backend.tokenizer, task, c, item_rows, pool)
        if isinstance(req, FreeformRequests):
            from .inference.generate import NonFiniteLogits

            try:
                gens = runner.group_generations(cfg, request, backend, c.decoding, req, progress, batching)
            except NonFiniteLogits as exc:
                item = next((it["item_id"] for it, p in zip(item_rows, req.prompts) if p == exc.prompt), "?")
                raise CellError(f"item {item}: {exc}") from exc
            rows = freeform_rows(task, item_rows, req, gens)
        else:
            rows = logprob_rows(backend, task, item_rows, req, progress, batching)
    except SafetyReproError as exc:
        raise CellError(f"cell {request.id}: {exc}") from exc
    except Exception as exc:  # OOM and friends: name the cell
        if "out of memory" in str(exc).lower():
            raise CellError(f"cell {request.id}: out of memory ({exc}); lower generation.batch_size") from exc
        raise
    wall = time.perf_counter() - t0

    dec = cfg.rules.level("decoding", c.decoding)
    exemplars = pool[: cfg.rules.level("shots", c.shots)["n"]]
    meta = ShardMeta(
        cell=request.config_id, model=request.model, benchmark=request.benchmark, seed=request.seed,
        variant=request.variant, template=c.template, decoding=c.decoding, shots=c.shots, scoring=c.scoring,
        temperature=dec["temperature"], top_p=dec.get("top_p", 1.0),
        max_new_tokens=req.max_new_tokens if isinstance(req, FreeformRequests) else None,
        decode_group=[list(g) for g in request.decode_group],
        template_hash=task.template_hash(c.template),
        chat_template_hash=info.get("chat_template_hash"), rules_stamp=cfg.rules.stamp, config_hash=cfg.hash,
        subset_hash=items_meta.get("subset_hash"), items_content_hash=items_meta.get("content_hash"),
        fewshot_ids=[x["item_id"] for x in exemplars],
        fewshot_hash=pool_meta.get("subset_hash"),
        fingerprint=cell_fp,
        parser_version=task.parser_version, model_info=dict(info),
        quantization=info.get("quantization", request.quantization), device=info.get("device"),
        batching=batching.as_dict(), code_version=code_version(), n_items=len(rows), wall_s=wall,
    )
    out = request.out
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


def logprob_rows(backend, task, items: list[dict], req: LogprobRequests, progress: bool,
                 batching) -> list[dict]:
    """Rows of a logprob cell scored by ``backend``; ``batching``: a
    :class:`.inference.batching.BatchRecord` that receives the engine's batch plans and
    out-of-memory splits."""
    t0 = time.perf_counter()
    scores = backend.score_candidates(req.contexts, req.candidates, batch_size=req.batch_size,
                                      progress=progress, record=batching)
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
            "n_prompt_tokens": backend.count_tokens(ctx), "n_gen_tokens": 0,
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
