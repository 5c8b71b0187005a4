"""Synthetic shards for fast tests of aggregation and the cell glue: a run config on the tiny
envelope with real item files (built from the shared benchmark data by the items step's own
code) and shards written with the shards module, whose rows say chosen answers (free-form:
the option letter; logprob: the candidate with the highest log-likelihood) so that a test
decides each cell's per-seed score. No model runs."""

from __future__ import annotations

from pathlib import Path

import yaml

from safetyrepro.config import load_config
from safetyrepro.grid import Config
from safetyrepro.hashing import text_hash
from safetyrepro.items import build_items, read_items
from safetyrepro.plan import Plan
from safetyrepro.shards import ShardMeta, write_shard
from safetyrepro.tasks import load_task
from workflow_support import DATA, ROOT
from config_support import config_copy


def synthetic_run(tmp: Path, n_items: int = 4, **over) -> Plan:
    """A plan for models m-nf4 and m-bf16 (configured as bf16) on TruthfulQA with the tiny
    envelope (2 seeds for the sampled decoding) and the precision check on; ``over``
    replaces top-level config sections. Item files are built under ``tmp/results``."""
    cfg = config_copy(ROOT / "tests/configs/tiny.yaml")
    source = cfg["models"]["smol-nf4"]["source"]
    cfg["models"] = {m: {"display_name": m, "quantization": q, "source": source}
                     for m, q in (("m-nf4", "nf4"), ("m-bf16", "bf16"))}
    cfg["benchmarks"] = {"truthfulqa": {"n_items": n_items}}
    cfg["envelope"]["rules"] = str(ROOT / "tests/configs/envelope_tiny.yaml")
    cfg["data"]["local_dir"] = str(DATA)
    cfg["runtime"]["results_dir"] = str(tmp / "results")
    cfg.update(over)
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    rc = load_config(path)
    for b in rc.benchmarks:
        if not Plan(rc).layout.items_path(b).exists():
            build_items(rc, b)
    return Plan(rc)


def items_of(plan: Plan, benchmark: str) -> tuple[list[dict], dict]:
    df, meta = read_items(plan.layout.items_path(benchmark))
    return df.to_dict(orient="records"), meta


def write_cell(plan: Plan, model: str, benchmark: str, config_id: str, seed: int, variant: str = "main",
               n_correct: int | None = None, **meta_over) -> Path:
    """Write the shard of one cell whose first ``n_correct`` items (default: all) are
    answered correctly and the rest wrongly; ``meta_over`` replaces metadata fields."""
    cfg = plan.cfg
    c = Config.parse(config_id)
    task = load_task(benchmark)
    items, items_meta = items_of(plan, benchmark)
    n_correct = len(items) if n_correct is None else n_correct
    letters = task.content["answer"]["letters"]
    rows = []
    for i, it in enumerate(items):
        n = len(task.candidates(it))
        chosen = int(it["gold"]) if i < n_correct else (int(it["gold"]) + 1) % n
        row = {"item_id": it["item_id"], "prompt_hash": text_hash("p"), "prompt": "p",
               "raw_output": None, "parsed_label": letters[chosen], "parse_ok": True, "correct": i < n_correct,
               "cand_logliks": None, "cand_ntokens": None, "chosen_index": None,
               "n_prompt_tokens": 1, "n_gen_tokens": 0, "finish_reason": None, "latency_s": 0.0}
        if c.scoring == "freeform":
            row.update(raw_output=f"The answer is {letters[chosen]}.", n_gen_tokens=5, finish_reason="stop")
        else:
            row.update(cand_logliks=[0.0 if j == chosen else -5.0 for j in range(n)],
                       cand_ntokens=[1] * n, chosen_index=chosen)
        rows.append(row)
    dec = cfg.rules.level("decoding", c.decoding)
    fields = dict(
        cell=config_id, model=model, benchmark=benchmark, seed=seed, variant=variant,
        template=c.template, decoding=c.decoding, shots=c.shots, scoring=c.scoring,
        temperature=dec["temperature"], top_p=dec.get("top_p", 1.0),
        max_new_tokens=cfg.max_new_tokens(benchmark, c.template) if c.scoring == "freeform" else None,
        decode_group=[list(g) for g in plan.decode_group(benchmark, config_id, variant)],
        template_hash=plan.fingerprints.template_hash(benchmark, c.template), chat_template_hash=None,
        rules_stamp=cfg.rules.stamp,
        config_hash=cfg.hash, subset_hash=items_meta["subset_hash"], items_content_hash=items_meta.get("content_hash"), fewshot_ids=[], fewshot_hash=None,
        fingerprint=plan.cell_fingerprint(model, benchmark, config_id, seed, variant),
        parser_version=task.parser_version, model_info={"weights_hash": "synthetic"},
        quantization=plan.quantization(model, variant), device="cpu",
        batching={"oom_splits": [], "plans": []}, code_version={},
        n_items=len(rows), wall_s=0.0)
    fields.update(meta_over)
    out = plan.layout.shard_path(model, benchmark, config_id, seed, variant)
    write_shard(out, rows, ShardMeta(**fields))
    return out


def write_all(plan: Plan, variant: str = "main", n_correct=None) -> list[Path]:
    """Every shard of the variant's jobs; ``n_correct(job)`` picks each cell's correct count."""
    return [write_cell(plan, j.model, j.benchmark, j.config.id, j.seed, variant,
                       None if n_correct is None else n_correct(j))
            for j in plan.jobs(variant)]
