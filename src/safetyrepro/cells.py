"""Run one cell: (model, benchmark, config, seed) over the benchmark's fixed item subset,
written as one Parquet shard (a row per item) with full provenance metadata.

The same function runs in-process (`safetyrepro run-cell`) or inside the persistent model
worker (`--worker`), where the loaded model is the worker's state. Sampled configs share
their prompts across seeds: the worker generates all seeds of a config in one pass (one
prefill, one decode per seed) and keeps the other seeds' outputs until their jobs ask.
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import RunConfig, load_config
from .errors import CellError, SafetyReproError
from .grid import Config
from .hashing import canonical_hash, text_hash
from .io import read_parquet, write_parquet
from .provenance import code_version


@dataclass
class CellSpec:
    model: str
    benchmark: str
    config_id: str
    seed: int
    quantization: str

    @property
    def id(self) -> str:
        return f"{self.model}/{self.benchmark}/{self.config_id}/s{self.seed} ({self.quantization})"


# ---- config / items caches (a worker serves many cells of the same run) ------------------
_CONFIGS: dict[tuple[str, float], RunConfig] = {}
_ITEMS: dict[tuple[str, float], tuple[list[dict], dict]] = {}
_SEED_CACHE: dict[tuple, dict[int, list]] = {}
_PREFILLS = weakref.WeakKeyDictionary()  # model -> PrefillStore (see _prefills)
PREFILL_STORE_MB = 2048  # default of runtime.prefill_store_mb


def _prefills(lm, cfg: RunConfig):
    """The model's :class:`~.inference.store.PrefillStore`: free-form and logprob cells of
    one (template, shots) often share the few-shot prefix and prompts; each prefill is computed
    once per worker (same outputs). Its budget is ``runtime.prefill_store_mb`` (default 2048;
    the prefills live where the model runs, so on a GPU this is GPU memory; 0 turns it off)."""
    from .inference.store import PrefillStore

    budget = int(cfg.section("runtime").get("prefill_store_mb", PREFILL_STORE_MB)) << 20
    store = _PREFILLS.get(lm.model)
    if store is None or store.max_bytes != budget:
        store = _PREFILLS[lm.model] = PrefillStore(budget)
    return store


def _config(path: str) -> RunConfig:
    key = (str(path), Path(path).stat().st_mtime)
    if key not in _CONFIGS:
        _CONFIGS[key] = load_config(path)
    return _CONFIGS[key]


def _items(path: Path) -> tuple[list[dict], dict]:
    from .items import read_items

    key = (str(path), path.stat().st_mtime if path.exists() else -1.0)
    if key not in _ITEMS:
        if not path.exists():
            raise CellError(f"item file {path} is missing; run `safetyrepro items` (or the workflow) first")
        df, meta = read_items(path)
        _ITEMS[key] = (df.to_dict(orient="records"), meta)
    return _ITEMS[key]


# ---- the worker entry points ----------------------------------------------------------------
def load_for_worker(config: str, model: str, quantization: str | None = None):
    """Worker loader: load the model once; the returned object is the worker's state.

    The worker computes every cell job of its model on this node, so it runs
    :func:`.models.load.compute_threads` threads (``runtime.threads``, default: every core this
    process may use), not the one-thread limit (``OMP_NUM_THREADS=1`` and friends) that
    Snakemake sets for each single-core job and that the worker inherits from the client that
    started it (measured: the worker then used one of this machine's two cores)."""
    import torch

    from .models import load_model
    from .models.load import compute_threads

    cfg = _config(config)
    torch.set_num_threads(compute_threads(cfg))
    return load_model(cfg, model, quantization=quantization)


def run_cell_in_worker(lm, **kwargs) -> dict:
    return run_cell(lm=lm, **kwargs)


# ---- the cell -------------------------------------------------------------------------------
def run_cell(*, config: str, model: str, benchmark: str, cell: str, seed: int, out: str,
             quantization: str | None = None, lm=None, progress: bool = True) -> dict:
    """Run one cell and write its shard atomically to ``out``. Returns a small summary."""
    from .plan import Plan
    from .tasks import load_task

    cfg = _config(config)
    plan = Plan(cfg)
    variant = "bf16" if quantization == "bf16" and cfg.model(model).get("quantization", "nf4") != "bf16" else "main"
    quant = quantization or cfg.model(model).get("quantization", "nf4")
    spec = CellSpec(model, benchmark, cell, int(seed), quant)
    try:
        c = Config.parse(cell)
    except ValueError as exc:
        raise CellError(f"cell {spec.id}: {exc}") from exc
    violations = cfg.rules.violations(benchmark, c.levels())
    if violations:
        raise CellError(f"cell {spec.id} is not valid under the rules ({', '.join(violations)})")
    if int(seed) >= cfg.n_seeds(c.decoding):
        raise CellError(f"cell {spec.id}: seed {seed} out of range (decoding {c.decoding} runs "
                        f"{cfg.n_seeds(c.decoding)} seed(s))")

    items, items_meta = _items(plan.items_path(benchmark))
    pool, pool_meta = _items(plan.fewshot_path(benchmark))
    n_shots = cfg.rules.level("shots", c.shots)["n"]
    if n_shots > len(pool):
        raise CellError(f"cell {spec.id}: {n_shots} shots requested but the few-shot pool has {len(pool)}")
    fewshot = pool[:n_shots]
    task = load_task(benchmark)

    if lm is None:
        from .models import load_model

        lm = load_model(cfg, model, quantization=quant)
    from .models import format_prompt

    from .inference.batching import BatchRecord

    t0 = time.perf_counter()
    batching = BatchRecord()  # the engine's batch plans and out-of-memory splits for this cell
    try:
        if c.scoring == "freeform":
            rows = _run_freeform(cfg, lm, task, spec, c, items, fewshot, progress,
                                 plan.decode_group(benchmark, cell, variant), batching)
        else:
            rows = _run_logprob(cfg, lm, task, spec, c, items, fewshot, progress, format_prompt,
                                batching)
    except SafetyReproError as exc:
        raise CellError(f"cell {spec.id}: {exc}") from exc
    except Exception as exc:  # OOM and friends: name the cell
        if "out of memory" in str(exc).lower():
            raise CellError(f"cell {spec.id}: out of memory ({exc}); lower generation.batch_size") from exc
        raise
    wall = time.perf_counter() - t0

    import pyarrow as pa

    dec = cfg.rules.level("decoding", c.decoding)
    meta: dict[str, Any] = {
        "kind": "shard",
        "cell": cell, "model": model, "benchmark": benchmark, "seed": int(seed),
        "template": c.template, "decoding": c.decoding, "shots": c.shots, "scoring": c.scoring,
        "temperature": dec["temperature"], "top_p": dec.get("top_p", 1.0),
        "max_new_tokens": cfg.max_new_tokens(benchmark, c.template) if c.scoring == "freeform" else None,
        "template_hash": task.template_hash(c.template),
        "rules_stamp": cfg.rules.stamp,
        "config_hash": cfg.hash,
        "subset_hash": items_meta.get("subset_hash"),
        "fewshot_ids": [x["item_id"] for x in fewshot],
        "fewshot_hash": pool_meta.get("subset_hash"),
        "fingerprint": plan.cell_fingerprint(model, benchmark, cell, int(seed), variant),
        "model_info": dict(lm.info),
        "quantization": lm.info.get("quantization", quant),
        "device": lm.info.get("device"),
        "batching": batching.as_dict(),
        "code_version": code_version(),
        "n_items": len(rows),
        "wall_s": wall,
    }
    table = pa.Table.from_pylist(rows, schema=SHARD_SCHEMA)
    write_parquet(table, out, meta)
    import resource

    return {"out": str(out), "n_items": len(rows), "wall_s": wall,
            "accuracy": sum(r["correct"] for r in rows) / max(len(rows), 1),
            "tokens": sum((r["n_prompt_tokens"] or 0) + (r["n_gen_tokens"] or 0) for r in rows),
            "generated_tokens": sum(r["n_gen_tokens"] or 0 for r in rows),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def _shard_schema():
    import pyarrow as pa

    return pa.schema([
        ("item_id", pa.string()), ("prompt_hash", pa.string()), ("prompt", pa.string()),
        ("raw_output", pa.string()), ("parsed_label", pa.string()), ("parse_ok", pa.bool_()),
        ("correct", pa.bool_()), ("cand_logliks", pa.list_(pa.float64())),
        ("cand_ntokens", pa.list_(pa.int32())), ("chosen_index", pa.int32()),
        ("n_prompt_tokens", pa.int32()), ("n_gen_tokens", pa.int32()),
        ("finish_reason", pa.string()), ("latency_s", pa.float64()),
    ])


SHARD_SCHEMA = _shard_schema()


SEED_CACHE_MAX = 4096  # decode groups with sequences still to hand out (outputs are small text)


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


def _group_generations(lm, spec, decoding: str, prompts, group, levels, kw, store, batching) -> list:
    """Generations of one (decoding, seed) of a free-form cell's decode group
    (:meth:`.plan.Plan.decode_group`: the greedy, T=0.3 and T=0.7 decodings of one template and
    shots, with all their seeds). The whole group is generated in one pass (one prefill, all
    its sequences decoded in one batch, :func:`.inference.generate_streams`) the first time
    any of its cells is asked for; the others wait in memory until their jobs come, in
    whatever order the scheduler sends them. A (decoding, seed) is handed out once; asking
    again (a rerun) generates the group afresh, with the same result, since each sequence
    drives its own generator and the batch is the same. What the engine recorded about the
    group's batches (plans, out-of-memory splits) goes into ``batching`` of every cell the
    group serves."""
    from .inference.backend import EngineBackend
    from .inference.batching import BatchRecord
    from .inference.generate import copy_generations

    # the prompts identify the template, shots and items; kw the generation settings
    key = (spec.model, spec.quantization, spec.benchmark, canonical_hash(prompts),
           canonical_hash(kw | {"progress": None}), tuple(group))
    pending, record = _SEED_CACHE.get(key, (None, None))
    if pending is None or (decoding, spec.seed) not in pending:
        streams, owners = group_streams(group, levels)
        record = BatchRecord()
        outs = EngineBackend(lm, store).generate_streams(prompts, streams, record=record, **kw)
        pending = {}
        for out, who in zip(outs, owners):
            for j, ds in enumerate(who):
                pending[ds] = out if j == 0 else copy_generations(out)
        _SEED_CACHE[key] = (pending, record)
        while len(_SEED_CACHE) > SEED_CACHE_MAX:  # oldest first
            _SEED_CACHE.pop(next(iter(_SEED_CACHE)))
    gens = pending.pop((decoding, spec.seed))
    if not pending:
        del _SEED_CACHE[key]
    batching.splits.extend(record.splits)
    batching.plans.extend(record.plans)
    return gens


def _run_freeform(cfg, lm, task, spec, c, items, fewshot, progress, group, batching):
    from .models import format_prompt

    prompts = [format_prompt(lm.tokenizer, task.build_messages(it, c.template, fewshot)) for it in items]
    kw = dict(max_new_tokens=cfg.max_new_tokens(spec.benchmark, c.template),
              batch_size=cfg.data["generation"]["batch_size"], progress=progress)
    levels = {d: cfg.rules.level("decoding", d) for d, _ in group}
    gens = _group_generations(lm, spec, c.decoding, prompts, group, levels, kw, _prefills(lm, cfg),
                              batching)
    rows = []
    for it, prompt, g in zip(items, prompts, gens):
        r = task.score_freeform(it, g.text)
        rows.append({
            "item_id": it["item_id"], "prompt_hash": text_hash(prompt), "prompt": prompt,
            "raw_output": g.text, "parsed_label": r.parsed_label, "parse_ok": bool(r.parse_ok),
            "correct": bool(r.correct), "cand_logliks": None, "cand_ntokens": None, "chosen_index": None,
            "n_prompt_tokens": g.n_prompt_tokens, "n_gen_tokens": g.n_gen_tokens,
            "finish_reason": g.finish_reason, "latency_s": g.latency_s,
        })
    return rows


def _run_logprob(cfg, lm, task, spec, c, items, fewshot, progress, format_prompt, batching):
    from .inference.backend import EngineBackend

    contexts, cands = [], []
    for it in items:
        messages, candidates = task.logprob_request(it, c.template, fewshot)
        contexts.append(format_prompt(lm.tokenizer, messages))
        cands.append(list(candidates))
    t0 = time.perf_counter()
    scores = EngineBackend(lm, _prefills(lm, cfg)).score_candidates(
        contexts, cands, batch_size=cfg.data["generation"]["batch_size"], record=batching,
        progress=progress)
    per_item = (time.perf_counter() - t0) / max(len(items), 1)
    rows = []
    for i, (it, ctx, sc) in enumerate(zip(items, contexts, scores)):
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


def read_shard(path: str | Path):
    """Read a shard, checking its schema; ShardError names the file on any problem."""
    from .errors import ShardError

    table, meta = read_parquet(path)
    if meta.get("kind") != "shard":
        raise ShardError(f"{path}: not a cell shard (metadata kind={meta.get('kind')!r})")
    missing = set(SHARD_SCHEMA.names) - set(table.column_names)
    if missing:
        raise ShardError(f"{path}: missing columns {sorted(missing)}")
    if table.num_rows != meta.get("n_items"):
        raise ShardError(f"{path}: {table.num_rows} rows but metadata says {meta.get('n_items')}")
    return table, meta
