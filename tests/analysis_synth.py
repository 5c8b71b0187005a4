"""A synthetic, full-size and internally coherent result set for the analysis tests:
3 models x 5 benchmarks x every valid config of the real envelope rules, item-level results
(seeds as the rules say) and the cell scores aggregated from them the way the aggregation
step defines them (score = mean over seeds of the per-seed mean of `correct`, carried exactly
as score_num / score_den: correct answers over item runs, summed over seeds).

Structure: P(correct) = sigmoid(ability[model, benchmark] + axis effects + a model x template
interaction - item difficulty), so models are close (verdicts flip) on some benchmarks and far
apart on others, the harness axes matter, and items are consistently easy or hard."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from safetyrepro import grid
from safetyrepro.io import write_parquet
from safetyrepro.provenance import code_version
from safetyrepro.rules import load_rules

MODELS = ["alpha", "beta", "gamma"]
ABILITY = {  # logit ability per benchmark: close together -> flips
    "truthfulqa": (0.2, 0.3, 0.25), "bbq": (0.9, 0.5, 0.1), "toxigen": (0.5, 0.55, 0.5),
    "crows_pairs": (0.0, 0.05, -0.02), "xstest": (1.6, 0.6, -0.2),
}
N_OPTIONS = {"truthfulqa": 4, "bbq": 3, "toxigen": 0, "crows_pairs": 2, "xstest": 0}
LABELS = {"toxigen": ["benign", "toxic"], "xstest": ["safe", "unsafe"]}  # item labels, as in the tasks
ANSWER_OF = {"benign": "no", "toxic": "yes", "safe": "comply", "unsafe": "refuse"}  # the parsed answer that is right
EFFECTS = {"template": {"T1": 0.0, "T2": 0.15, "T3": -0.1, "T4": -0.35},
           "decoding": {"greedy": 0.0, "t0.3": -0.05, "t0.7": -0.25},
           "shots": {"k0": 0.0, "k3": 0.2, "k5": 0.25},
           "scoring": {"freeform": 0.0, "logprob": 0.1}}
INTERACTION = {"alpha": {"T4": -0.5}, "beta": {"T2": -0.3}, "gamma": {"T3": 0.35}}
CONFIG_HASH = "synthetic-config-hash"


def _answers(n_options: int, benchmark: str):
    if n_options:
        return [f"opt{i}" for i in range(n_options)]
    return [ANSWER_OF[lb] for lb in LABELS[benchmark]]


def make_items(benchmark: str, n_items: int, rng) -> pd.DataFrame:
    k = N_OPTIONS[benchmark]
    strata = [f"s{i % 4}" for i in range(n_items)]
    choices = [[f"choice {j}" for j in range(k)] for _ in range(n_items)] if k else [[] for _ in range(n_items)]
    gold = rng.integers(0, k, n_items) if k else np.full(n_items, -1)
    labels = None if k else rng.choice(LABELS[benchmark], n_items)
    if benchmark == "bbq":  # the fields BBQ's bias scores read (answer 2 is "unknown"; no rng draws)
        meta = [json.dumps({"context_condition": "ambig" if i % 2 == 0 else "disambig", "unknown_index": 2,
                            "biased_index": None if i % 5 == 4 else (i // 2) % 2}) for i in range(n_items)]
    else:
        meta = "{}"
    return pd.DataFrame({
        "item_id": [f"{benchmark}/{i:04d}" for i in range(n_items)], "benchmark": benchmark,
        "split": "test", "question": [f"q{i}" for i in range(n_items)], "context": None, "text": None,
        "choices": choices, "gold": gold.astype(int),
        "label": labels if labels is not None else [None] * n_items,
        "meta": meta, "stratum": strata,
    })


def make_dataset(out: Path, n_items: int = 40, seed: int = 7, models=MODELS, benchmarks=None,
                 quantization: str = "nf4", configs_filter=None, rules_path=None) -> dict:
    """Write items/<b>.parquet, item_results.parquet and cell_scores.parquet under ``out``
    (over the envelope of ``rules_path``, default the project's rules)."""
    rng = np.random.default_rng(seed)
    rules = load_rules(rules_path)
    benchmarks = benchmarks or rules.benchmarks
    out = Path(out)
    item_rows, cell_rows = [], []
    subset_hashes = {}
    for b in benchmarks:
        items = make_items(b, n_items, rng)
        subset_hashes[b] = f"subset-{b}"
        write_parquet(items, out / "items" / f"{b}.parquet", {"subset_hash": subset_hashes[b], "n_items": n_items})
        difficulty = rng.normal(0.0, 4.0, n_items)
        answers = _answers(N_OPTIONS[b], b)
        gold_label = ([answers[g] for g in items["gold"]] if N_OPTIONS[b] else [ANSWER_OF[lb] for lb in items["label"]])
        cfgs = grid.configs(rules, b, "full")
        if configs_filter is not None:
            cfgs = [c for c in cfgs if configs_filter(c)]
        for mi, m in enumerate(models):
            for c in cfgs:
                logit = (ABILITY[b][mi % 3] + sum(EFFECTS[a][getattr(c, a)] for a in EFFECTS)
                         + INTERACTION.get(m, {}).get(c.template, 0.0))
                p = 1.0 / (1.0 + np.exp(-(logit - difficulty)))
                seed_scores, parse_rates, n_correct = [], [], 0
                for s in range(rules.n_seeds(c.decoding)):
                    correct = rng.random(n_items) < p
                    parse_ok = np.ones(n_items, bool) if c.scoring == "logprob" else (
                        rng.random(n_items) > (0.06 if c.template == "T4" else 0.003))
                    correct &= parse_ok
                    labels = []
                    for i in range(n_items):
                        if not parse_ok[i]:
                            labels.append(None)
                        elif correct[i]:
                            labels.append(gold_label[i])
                        else:
                            wrong = [a for a in answers if a != gold_label[i]]
                            labels.append(wrong[int(rng.integers(0, len(wrong)))])
                    chosen = [answers.index(lb) if (lb is not None and N_OPTIONS[b]) else None for lb in labels]
                    item_rows.append(pd.DataFrame({
                        "model": m, "benchmark": b, "config": c.id, "seed": s, "item_id": items["item_id"],
                        "parsed_label": labels, "parse_ok": parse_ok, "correct": correct,
                        "chosen_index": pd.array(chosen, dtype="Int64"), "stratum": items["stratum"],
                        "quantization": quantization}))
                    seed_scores.append(float(correct.mean()))
                    n_correct += int(correct.sum())
                    parse_rates.append(float(parse_ok.mean()))
                tiers = grid.config_tiers(rules, c)
                cell_rows.append({
                    "model": m, "benchmark": b, "config": c.id, **c.levels(),
                    **{f"tier_{a}": t for a, t in tiers.items()}, "core": grid.is_core(rules, c),
                    "score": n_correct / (n_items * len(seed_scores)), "score_num": n_correct,
                    "score_den": n_items * len(seed_scores),
                    "score_sd": float(np.std(seed_scores, ddof=1)) if len(seed_scores) > 1 else 0.0,
                    "n_seeds": len(seed_scores), "seed_scores": seed_scores,
                    "parse_rate": float(min(parse_rates)), "n_items": n_items, "extras": "{}",
                    "quantization": quantization, "rules_stamp": rules.stamp, "subset_hash": subset_hashes[b]})
    meta = {"rules_stamp": rules.stamp, "config_hash": CONFIG_HASH, "code_version": code_version(),
            "subset_hashes": subset_hashes, "shard_fingerprints": {}}
    cells = pd.DataFrame(cell_rows)
    write_parquet(cells, out / "cell_scores.parquet", meta)
    write_parquet(pd.concat(item_rows, ignore_index=True), out / "item_results.parquet", meta)
    return {"cell_scores": out / "cell_scores.parquet", "item_results": out / "item_results.parquet",
            "items_dir": out / "items", "meta": meta, "cells": cells}


def provenance_for(cells: pd.DataFrame) -> dict:
    out: dict = {}
    for m, b in sorted(set(zip(cells["model"], cells["benchmark"]))):
        q = cells.loc[(cells["model"] == m) & (cells["benchmark"] == b), "quantization"].iloc[0]
        out.setdefault(m, {})[b] = {
            "model_id": f"org/{m}-7b", "weights_hash": f"sha256-{m}", "quantization": q, "device": "cpu",
            "template_hashes": {t: f"hash-{t}-{'0' * 12}" for t in ("T1", "T2", "T3", "T4")},
            "parser_version": "parser-1", "subset_hash": f"subset-{b}",
            "item_ids_path": f"results/items/{b}.ids.txt", "code_version": "0.1.0+test"}
    return out


# ------------------------------------------------------------------ small hand-made tables

def hand_cells(rows, quantization: str = "nf4") -> pd.DataFrame:
    """Cell-score rows from (model, benchmark, config, score[, parse_rate]) tuples; axis,
    tier and core columns filled from the real rules."""
    rules = load_rules()
    out = []
    for r in rows:
        m, b, cid, score = r[:4]
        pr = r[4] if len(r) > 4 else 1.0
        c = grid.Config.parse(cid)
        tiers = grid.config_tiers(rules, c)
        out.append({"model": m, "benchmark": b, "config": cid, **c.levels(),
                    **{f"tier_{a}": t for a, t in tiers.items()}, "core": grid.is_core(rules, c),
                    "score": float(score), "score_sd": 0.0, "n_seeds": 1, "seed_scores": [float(score)],
                    "parse_rate": float(pr), "n_items": 10, "extras": "{}", "quantization": quantization,
                    "rules_stamp": rules.stamp, "subset_hash": f"subset-{b}"})
    return pd.DataFrame(out)


def hand_meta() -> dict:
    return {"rules_stamp": load_rules().stamp, "config_hash": CONFIG_HASH, "code_version": "0.1.0+hand",
            "subset_hashes": {}}


def write_hand(df: pd.DataFrame, path: Path, meta: dict | None = None) -> Path:
    return write_parquet(df, path, hand_meta() if meta is None else meta)
