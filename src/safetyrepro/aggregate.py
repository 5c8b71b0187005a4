"""Scoring and aggregation: shards -> the cell-score grid and the item-level results.

Free-form raw outputs are re-parsed here with the current parsers (the only place outputs
become labels), so a parser fix re-scores without re-running any model. Aggregation refuses to
mix shards that carry different rules stamps or item-subset hashes, or that are stale (their
fingerprint differs from the plan's), and lists the offending files.

It reads exactly the files it is given (:class:`AggregateInputs`: each cell's shard with the
fingerprint the plan expects of it, and the item files; the workflow writes them for the job,
:func:`.aggregate_inputs.write_inputs`) and the run config with its rules; it does not plan the run again.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm import tqdm

from .aggregate_inputs import AggregateInputs
from .errors import ShardError
from .fingerprints import scoring_fingerprint
from .grid import Job, config_of
from .io import write_csv, write_parquet
from .items import read_items
from .provenance import code_stamp, code_version, format_code_version
from .results_layout import aggregate_outputs
from .rules import AXES
from .shards import read_shard
from .sysutil import atomic_write_text
from .tasks import load_task


def _check_consistent(metas: dict[str, dict], key: str, what: str) -> None:
    groups = defaultdict(list)
    for path, m in metas.items():
        groups[m.get(key)].append(path)
    if len(groups) > 1:
        lines = [f"  {k}: {len(v)} shard(s), e.g. " + ", ".join(v[:3]) for k, v in groups.items()]
        raise ShardError(f"shards carry different {what}; refusing to mix them:\n" + "\n".join(lines)
                         + "\nrerun the stale cells (snakemake reruns them when their fingerprint changed)")


# What a shard's numbers depend on beyond its fingerprint, recorded by the model loader in
# every shard's ``model_info``: one model's shards must agree on all of them (a replaced local
# model folder changes the weights hash; another machine the device, dtype, matmul path or
# library versions). Fields a shard does not record count as None.
NUMERICS_FIELDS = ("weights_hash", "quantization", "device", "dtype", "compute_dtype", "nf4_matmul",
                   "attention", "linear", "torch_version", "transformers_version", "bitsandbytes_version",
                   "chat_template_hash")


SHARD_NUMERICS_FIELDS = ("chat_template_hash",)  # recorded as ShardMeta fields, not in model_info

# The numerics a GRID card discloses besides weights hash, quantization, device and chat template
# (compute_dtype: the arithmetic, float32 on a CPU without native bf16 even where dtype says bf16)
CARD_NUMERICS_FIELDS = ("dtype", "compute_dtype", "nf4_matmul", "attention", "linear", "torch_version",
                        "transformers_version", "bitsandbytes_version")


def _numerics_value(meta: dict, field: str):
    """A shard's value of a :data:`NUMERICS_FIELDS` field: its own metadata field where the
    shard layout has one (``ShardMeta.chat_template_hash``), else its ``model_info``'s."""
    if field in SHARD_NUMERICS_FIELDS:
        return meta.get(field)
    return (meta.get("model_info") or {}).get(field)


def check_numerics(metas: dict[str, dict]) -> None:
    """ShardError if the shards of one model differ in any :data:`NUMERICS_FIELDS`, naming
    the values and shards of each group."""
    by_model = defaultdict(dict)
    for path, m in metas.items():
        by_model[m.get("model")][path] = m
    problems = []
    for model, shards in sorted(by_model.items(), key=lambda kv: str(kv[0])):
        for field in NUMERICS_FIELDS:
            groups = defaultdict(list)
            for path, m in shards.items():
                groups[str(_numerics_value(m, field))].append(path)
            if len(groups) > 1:
                problems.append(f"model {model}: different {field}:\n" + "\n".join(
                    f"    {value}: {len(paths)} shard(s), e.g. " + ", ".join(sorted(paths)[:3])
                    for value, paths in sorted(groups.items())))
    if problems:
        raise ShardError("shards of one model were computed with different numerics; refusing to "
                         "mix them:\n  " + "\n  ".join(problems) + "\ndelete the shards of the "
                         "setup you do not want (e.g. those of a replaced model folder) and run the "
                         "workflow again")


def aggregate(cfg, inputs: AggregateInputs, progress: bool = True):
    """Return (cell_scores DataFrame, item_results DataFrame, metadata dict) of the shards and
    item files ``inputs`` names; ``cfg``: the run config (rules, model names)."""
    return _aggregate(cfg, inputs, progress)[:3]


def _aggregate(cfg, inputs: AggregateInputs, progress: bool):
    """:func:`aggregate`'s results and the metadata of every shard read ({path: dict})."""
    variant, item_files = inputs.variant, inputs.items
    benchmarks = list(item_files)
    unlisted = sorted({e.benchmark for e in inputs.shards} - set(benchmarks))
    if unlisted:
        raise ShardError(f"the aggregation inputs name no item file for {', '.join(unlisted)}")
    metas, tables, job_of = {}, {}, {}
    problems = []
    for e in tqdm(inputs.shards, desc=f"reading shards ({variant})", disable=not progress):
        p = e.path
        try:
            t, shard_meta = read_shard(p)
            m = shard_meta.as_dict()
        except ShardError as exc:
            problems.append(str(exc))
            continue
        if m.get("fingerprint") != e.fingerprint:
            problems.append(f"{p}: stale (written for fingerprint {str(m.get('fingerprint'))[:12]}, "
                            f"plan expects {e.fingerprint[:12]})")
            continue
        metas[p], tables[p] = m, t
        job_of[p] = Job(e.model, e.benchmark, config_of(cfg.rules, e.config_id), e.seed)
    if problems:
        raise ShardError(f"{len(problems)} shard(s) missing, corrupt or stale:\n  "
                         + "\n  ".join(problems[:20]) + ("\n  ..." if len(problems) > 20 else ""))
    _check_consistent(metas, "rules_stamp", "rules stamps")
    check_numerics(metas)
    for b in benchmarks:
        _check_consistent({p: m for p, m in metas.items() if job_of[p].benchmark == b}, "subset_hash",
                          f"item-subset hashes for {b}")

    items_by_bench = {}
    for b in benchmarks:
        df, im = read_items(Path(item_files[b]))
        items_by_bench[b] = ({r["item_id"]: r for r in df.to_dict(orient="records")}, im)

    # the shard list's entry of each shard names its cell (model, benchmark, Config, seed): the
    # shard's own metadata agrees (its fingerprint was checked against the entry's above)
    per_seed = defaultdict(dict)   # (model, benchmark, Config) -> seed -> summary
    item_rows = []
    for p, m in metas.items():
        j = job_of[p]
        b = j.benchmark
        task = load_task(b)
        items, im = items_by_bench[b]
        if m["subset_hash"] != im.get("subset_hash"):
            raise ShardError(f"{p}: item-subset hash {m['subset_hash'][:12]} differs from the current "
                             f"items file {item_files[b]} ({str(im.get('subset_hash'))[:12]})")
        if m.get("items_content_hash") and im.get("content_hash") \
                and m["items_content_hash"] != im["content_hash"]:
            # same items, other content (an items-code change rewrote their text or choices):
            # the cell read other prompts. Cells do not rerun for rebuilt items by themselves.
            raise ShardError(f"{p}: computed from items content {m['items_content_hash'][:12]}, but "
                             f"{item_files[b]} now holds {im['content_hash'][:12]} (the items "
                             f"code changed their content); delete the shards of {b} "
                             f"({cfg.results_dir}/shards*/*/{b}/) and run the workflow again")
        rows = tables[p].to_pylist()
        results, its = [], []
        for r in rows:
            it = items.get(r["item_id"])
            if it is None:
                raise ShardError(f"{p}: item {r['item_id']} is not in {item_files[b]}")
            if j.config.scoring == "freeform":
                res = task.score_freeform(it, r["raw_output"] or "")
                chosen = None
            else:
                res = task.score_logprob(it, list(r["cand_logliks"]), list(r["cand_ntokens"]))
                chosen = res.chosen_index
            results.append(res)
            its.append(it)
            item_rows.append({"model": j.model, "benchmark": b, "config": j.config.id, "seed": j.seed,
                              "item_id": r["item_id"], "parsed_label": res.parsed_label,
                              "parse_ok": bool(res.parse_ok), "correct": bool(res.correct),
                              "chosen_index": chosen, "stratum": it.get("stratum"),
                              "quantization": m["quantization"]})
        summary = task.summarize(results, its)
        summary["quantization"] = m["quantization"]
        summary["subset_hash"] = m["subset_hash"]
        per_seed[(j.model, b, j.config)][j.seed] = summary

    rules = cfg.rules
    cell_rows = []
    for (model, b, c), seeds in sorted(per_seed.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2].id)):
        cid = c.id
        ordered = [seeds[s] for s in sorted(seeds)]
        scores = [float(s["score"]) for s in ordered]
        # the cell score as an exact fraction: correct answers summed over seeds over items summed
        # over seeds (= the mean of the per-seed accuracies, which share one item count)
        num = sum(int(s["score_num"]) for s in ordered)
        den = sum(int(s["score_den"]) for s in ordered)
        if den <= 0 or len({int(s["score_den"]) for s in ordered}) > 1:
            raise ShardError(f"({model}, {b}, {cid}): per-seed item counts {[s['score_den'] for s in ordered]} "
                             "differ or are zero; the seeds of a cell must score the same items")
        tiers = {f"tier_{a}": rules.tier(a, getattr(c, a)) for a in AXES}
        extras = {k: float(np.mean([s["extras"][k] for s in ordered if k in s.get("extras", {})]))
                  for k in ordered[0].get("extras", {})
                  if all(isinstance(s.get("extras", {}).get(k), (int, float)) for s in ordered)}
        cell_rows.append({
            "model": model, "benchmark": b, "config": cid, **c.levels(), **tiers,
            "core": all(t == "core" for t in tiers.values()),
            "score": num / den, "score_num": num, "score_den": den, "score_sd": float(np.std(scores, ddof=1)) if len(scores) > 1 else 0.0,
            "n_seeds": len(scores), "seed_scores": scores,
            "parse_rate": float(min(s["parse_rate"] for s in ordered)),
            "n_items": int(ordered[0]["n_items"]), "extras": json.dumps(extras, sort_keys=True),
            "quantization": ordered[0]["quantization"], "rules_stamp": rules.stamp,
            "subset_hash": ordered[0]["subset_hash"],
        })
    cells = pd.DataFrame(cell_rows)
    items_df = pd.DataFrame(item_rows)
    meta = {
        "kind": "cell_scores", "variant": variant, "rules_stamp": rules.stamp, "config_hash": cfg.hash,
        "code_version": code_version(), **code_stamp(__name__),
        "scoring_fingerprint": scoring_fingerprint(benchmarks),
        "subset_hashes": {b: items_by_bench[b][1].get("subset_hash") for b in benchmarks},
        "n_shards": len(metas), "n_cells": len(cells),
        "shard_fingerprints": {p: metas[p]["fingerprint"] for p in sorted(metas)},
    }
    return cells, items_df, meta, metas


def provenance_records(cfg, items: dict[str, str | Path], metas: dict[str, dict]) -> dict:
    """{model: {benchmark: record}} for the GRID cards, gathered from the shards' metadata."""
    out: dict = {}
    for m in metas.values():
        model, b = m["model"], m["benchmark"]
        rec = out.setdefault(model, {}).setdefault(b, {
            "model_id": cfg.model(model).get("display_name", model),
            "weights_hash": m["model_info"].get("weights_hash", ""),
            "quantization": m["quantization"], "device": m.get("device") or "",
            "template_hashes": {}, "parser_version": load_task(b).parser_version,
            "subset_hash": m["subset_hash"], "item_ids_path": str(items[b]),
            "code_versions": set(),
        })
        rec["template_hashes"][m["template"]] = m["template_hash"]
        rec["code_versions"].add(format_code_version(m.get("code_version", {})))
        # check_numerics made these one value per model; the card discloses them
        rec["chat_template_hash"] = _numerics_value(m, "chat_template_hash")
        rec["numerics"] = {f: (m.get("model_info") or {}).get(f) for f in CARD_NUMERICS_FIELDS}
        batching = m.get("batching") or {}
        acc = rec.setdefault("_batching", {"caps": set(), "largest": 0, "oom_splits": 0, "planned": 0})
        for p in batching.get("plans", []):
            acc["planned"] += 1
            if p.get("batch_size_cap") is not None:
                acc["caps"].add(int(p["batch_size_cap"]))
            acc["largest"] = max([acc["largest"], *(int(b.get("prompts", 0)) for b in p.get("batches", []))])
        acc["oom_splits"] += len(batching.get("oom_splits", []))
    for per_b in out.values():
        for rec in per_b.values():
            rec["code_version"] = ", ".join(sorted(rec.pop("code_versions")))
            acc = rec.pop("_batching")
            rec["batching"] = {"batch_size_caps": sorted(acc["caps"]), "largest_batch_prompts": acc["largest"],
                               "memory_plans": acc["planned"], "oom_splits": acc["oom_splits"]}
    return out


def write_aggregate(cfg, inputs: AggregateInputs, out_dir: str | Path) -> dict:
    """Write :func:`aggregate`'s tables to :func:`.results_layout.aggregate_outputs` of ``out_dir``."""
    cells, items_df, meta, metas = _aggregate(cfg, inputs, progress=True)
    paths = aggregate_outputs(out_dir, inputs.variant)
    write_parquet(cells, paths["cell_scores"], meta)
    write_parquet(items_df, paths["item_results"], meta | {"kind": "item_results"})
    if inputs.variant == "main":
        write_csv(cells, paths["cell_scores_csv"])
        atomic_write_text(paths["provenance"],
                          json.dumps(provenance_records(cfg, inputs.items, metas), indent=2, sort_keys=True))
    return {k: str(v) for k, v in paths.items()}
