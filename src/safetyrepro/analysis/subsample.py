"""Stability under stratified item subsamples (docs/VERDICTS.md section 6).

For each benchmark and each of ``repeats`` subsamples (``fraction`` of the items, stratified,
seed ``seed + r``), every cell score is recomputed from the item results (CrowS-Pairs under the
parity convention as its cell score is). Reported: per-cell score ranges over the repeats, how
often the core configs' model ordering differs from the all-items one, orderings reachable,
and rho_flip per pair and its max over the full envelope per repeat (``subsample_rho_flip``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from tqdm import tqdm

from ..errors import DataError
from ..grid import config_of, is_core
from ..io import read_parquet
from ..items.subsample import stratified_subsample
from ..metrics import orderings
from ..metrics.compare import Scores, diff_sign
from ..metrics.itemgrid import item_grid_from_results
from ..metrics.resampling import DEFAULT_SAMPLES
from ..metrics.significance import bench_null, null_summary, pair_null
from ..rules import load_rules
from ..tasks import score_is_item_mean
from .common import (check_rules_file, load_item_results, output_metadata, weak_ranks,
                     write_tables)

SUMMARY_COLUMNS = ["benchmark", "fraction", "repeats", "seed", "n_items", "n_items_sub", "n_cells",
                   "range_median", "range_max", "abs_dev_max", "n_core_configs", "ordering_changes",
                   "ordering_change_rate", "configs_changed_any", "orderings_reachable_full",
                   "orderings_reachable_sub_min", "orderings_reachable_sub_max", "n_configs",
                   "max_rho_flip_all_items", "max_rho_flip_sub_min", "max_rho_flip_sub_median",
                   "max_rho_flip_sub_max", "max_rho_flip_null_mean_all_items", "max_rho_flip_null_q95_all_items",
                   "max_rho_flip_null_p_all_items", "max_rho_flip_null_mean_sub", "max_rho_flip_null_q95_sub",
                   "max_rho_flip_null_p_sub", "noise_note"]
RHO_COLUMNS = ["benchmark", "statistic", "model_a", "model_b", "repeat", "seed", "n_configs", "rho_flip",
               "rho_flip_all_items", "rho_flip_null_mean", "rho_flip_null_q95", "rho_flip_null_p"]
CELL_COLUMNS = ["model", "benchmark", "config", "core", "score_all_items", "score_sub_median",
                "score_sub_min", "score_sub_max", "range"]


class ItemMatrix:
    """An item outcome (``correct`` by default) as a (model, config, seed) x item matrix for
    one benchmark. ``parity``: the outcome is "sent_more preferred" and a run's score is
    CrowS-Pairs' parity distance (n - |2 k - n|) / n of its k such items out of n."""

    def __init__(self, results: pd.DataFrame, value: str = "correct", parity: bool = False):
        runs = results.groupby(["model", "config", "seed", "item_id"]).size()
        if (runs > 1).any():
            dup = runs.index[runs > 1][0]
            raise DataError("item_results", f"item {dup[3]!r} appears twice in run {dup[:3]}")
        wide = results.pivot_table(index=["model", "config", "seed"], columns="item_id", values=value,
                                   aggfunc="first")
        self.parity = parity
        self.items = list(wide.columns)
        self.index = wide.index
        self.values = wide.to_numpy(dtype=float)   # NaN where an item is missing from a run

    def cell_counts(self, item_ids=None) -> pd.DataFrame:
        """(model, config) -> score_num (correct answers summed over seeds and item_ids),
        score_den (items summed over seeds) and score = score_num / score_den, the mean over
        seeds of the per-seed accuracy (the seeds of a cell score the same items)."""
        vals = self.values
        if item_ids is not None:
            pos = {it: i for i, it in enumerate(self.items)}
            missing = [i for i in item_ids if i not in pos]
            if missing:
                raise DataError("item_results", f"subsampled item {missing[0]!r} has no results")
            vals = vals[:, [pos[i] for i in item_ids]]
        present = ~np.isnan(vals)
        k = np.where(present, vals, 0.0).sum(axis=1).round().astype(np.int64)
        n = present.sum(axis=1).astype(np.int64)
        if self.parity:
            k = n - np.abs(2 * k - n)
        per_run = pd.DataFrame({"score_num": k, "score_den": n}, index=self.index)
        out = per_run.groupby(level=["model", "config"]).sum()
        out["score"] = out["score_num"] / out["score_den"]
        return out

    def cell_scores(self, item_ids=None) -> pd.Series:
        """(model, config) -> the cell score on item_ids (float; see :meth:`cell_counts`)."""
        return self.cell_counts(item_ids)["score"]


def _wide(counts: pd.DataFrame, configs: list[str], models: list[str]) -> Scores:
    """configs x models exact scores."""
    num = counts["score_num"].unstack("model").reindex(index=configs, columns=models)
    den = counts["score_den"].unstack("model").reindex(index=configs, columns=models)
    return Scores(num=num.to_numpy(dtype=np.int64), den=den.to_numpy(dtype=np.int64))


def _orders(counts: pd.DataFrame, configs: list[str], models: list[str], tol: float | None) -> dict[str, tuple]:
    mat = _wide(counts, configs, models)
    return {c: weak_ranks(mat[i], tol) for i, c in enumerate(configs)}


def _reachable(counts: pd.DataFrame, configs: list[str], models: list[str], tol: float | None) -> int:
    if not configs:
        return 0
    mat = _wide(counts, configs, models)
    return orderings({m: mat[:, j] for j, m in enumerate(models)}, tol)["reachable"]


def _rho_flips(counts: pd.DataFrame, configs: list[str], models: list[str],
               tol: float | None) -> dict[tuple[str, str], float]:
    """(A, B) -> rho_flip over ``configs`` for every model pair A < B (exact signs)."""
    mat = _wide(counts, configs, models)
    out = {}
    for i, a in enumerate(models):
        for j in range(i + 1, len(models)):
            s = diff_sign(mat[:, i], mat[:, j], tol)
            out[(a, models[j])] = min(int(np.sum(s > 0)), int(np.sum(s < 0))) / len(configs)
    return out


def subsample_stability(results: pd.DataFrame, items: dict[str, pd.DataFrame], core: set[tuple[str, str]],
                        fraction: float = 0.8, repeats: int = 20, seed: int = 0, tol: float = 0.0,
                        strata_col: str = "stratum", progress: bool = False, parity: set[str] = frozenset(),
                        noise_samples: int = DEFAULT_SAMPLES) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(per-benchmark summary, per-cell ranges, per-repeat rho_flip). ``core``: the (benchmark,
    config) core configs; ``items``: benchmark -> canonical item table; ``parity``: benchmarks
    scored by CrowS-Pairs' parity distance (then ``results`` needs ``parsed_label``). The noise
    columns: the max rho_flip of exchangeable models (``noise_samples`` model permutations)
    on all items and on the first repeat's subsample (none for parity-scored benchmarks)."""
    if not 0 < fraction <= 1:
        raise ValueError("fraction must be in (0, 1]")
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    summary, cells, rhos = [], [], []
    for b in sorted(results["benchmark"].unique()):
        if b not in items:
            raise DataError("items", f"no item table for benchmark {b!r}")
        res = results[results["benchmark"] == b]
        if b in parity:
            if "parsed_label" not in res.columns:
                raise DataError("item_results", f"{b} is scored by parity distance: needs 'parsed_label'")
            m = ItemMatrix(res.assign(more=(res["parsed_label"] == "more").astype(float)), "more", parity=True)
        else:
            m = ItemMatrix(res)
        full_counts = m.cell_counts()
        full = full_counts["score"]
        models = sorted(full.index.get_level_values("model").unique())
        configs = sorted(full.index.get_level_values("config").unique())
        core_cfgs = [c for c in configs if (b, c) in core]
        have = full.groupby(level="config").size()
        env_cfgs = [c for c in configs if have.get(c, 0) == len(models)]  # complete configs only
        full_rho = _rho_flips(full_counts, env_cfgs, models, tol) if env_cfgs and len(models) > 1 else {}
        rep_max = []
        full_orders = _orders(full_counts, core_cfgs, models, tol)
        subs, n_sub, changes, changed = [], [], 0, set()
        reach = []
        for r in tqdm(range(repeats), desc=f"subsamples {b}", disable=not progress):
            sub_items = stratified_subsample(items[b], fraction, seed + r, strata_col=strata_col)
            ids = list(sub_items["item_id"].astype(str))
            n_sub.append(len(ids))
            counts = m.cell_counts(ids)
            subs.append(counts["score"])
            orders = _orders(counts, core_cfgs, models, tol)
            for c in core_cfgs:
                if orders[c] != full_orders[c]:
                    changes += 1
                    changed.add(c)
            reach.append(_reachable(counts, core_cfgs, models, tol))
            if full_rho:
                rep = _rho_flips(counts, env_cfgs, models, tol)
                rep_max.append(max(rep.values()))
                nul = _repeat_noise(res, b, env_cfgs, ids, rep, rep_max[-1], noise_samples, seed, tol) \
                    if b not in parity else {}
                if r == 0:
                    first_noise = nul
                for (a, m2), v in rep.items():
                    rhos.append({"benchmark": b, "statistic": f"{a} vs {m2}", "model_a": a, "model_b": m2,
                                 "repeat": r, "seed": seed + r, "n_configs": len(env_cfgs), "rho_flip": v,
                                 "rho_flip_all_items": full_rho[(a, m2)], **nul.get((a, m2), {})})
                rhos.append({"benchmark": b, "statistic": "max", "model_a": "", "model_b": "", "repeat": r,
                             "seed": seed + r, "n_configs": len(env_cfgs), "rho_flip": rep_max[-1],
                             "rho_flip_all_items": max(full_rho.values()), **nul.get("max", {})})
        table = pd.concat(subs, axis=1, keys=range(repeats))
        rng = table.max(axis=1) - table.min(axis=1)
        dev = table.sub(full, axis=0).abs().max(axis=1)
        for (model, cfg), v in rng.items():
            cells.append({"model": model, "benchmark": b, "config": cfg, "core": (b, cfg) in core,
                          "score_all_items": float(full[(model, cfg)]),
                          "score_sub_median": float(table.loc[(model, cfg)].median()),
                          "score_sub_min": float(table.loc[(model, cfg)].min()),
                          "score_sub_max": float(table.loc[(model, cfg)].max()), "range": float(v)})
        noise = _max_rho_noise(res, b, env_cfgs, first_noise["max"], full_rho, noise_samples, seed, tol) \
            if b not in parity and full_rho else {"noise_note": "no item-level noise reference (parity-distance score)"
                                                  if b in parity else "fewer than two models"}
        n_pairs = len(core_cfgs) * repeats
        summary.append({**noise,
            "benchmark": b, "fraction": float(fraction), "repeats": int(repeats), "seed": int(seed),
            "n_items": len(items[b]), "n_items_sub": float(np.mean(n_sub)), "n_cells": int(len(rng)),
            "range_median": float(rng.median()), "range_max": float(rng.max()), "abs_dev_max": float(dev.max()),
            "n_core_configs": len(core_cfgs), "ordering_changes": int(changes),
            "ordering_change_rate": changes / n_pairs if n_pairs else float("nan"),
            "configs_changed_any": len(changed),
            "orderings_reachable_full": _reachable(full_counts, core_cfgs, models, tol),
            "orderings_reachable_sub_min": int(min(reach)), "orderings_reachable_sub_max": int(max(reach)),
            "n_configs": len(env_cfgs),
            "max_rho_flip_all_items": max(full_rho.values()) if full_rho else float("nan"),
            "max_rho_flip_sub_min": float(np.min(rep_max)) if rep_max else float("nan"),
            "max_rho_flip_sub_median": float(np.median(rep_max)) if rep_max else float("nan"),
            "max_rho_flip_sub_max": float(np.max(rep_max)) if rep_max else float("nan")})
    return (pd.DataFrame(summary, columns=SUMMARY_COLUMNS), pd.DataFrame(cells, columns=CELL_COLUMNS),
            pd.DataFrame(rhos, columns=RHO_COLUMNS))


def _repeat_noise(res: pd.DataFrame, b: str, configs: list[str], ids: list[str], rep: dict, rep_max: float,
                  samples: int, seed: int, tol) -> dict:
    """Noise references of one subsample: per pair (sign flips) and for the max (permutations)."""
    sub = res[res["config"].isin(configs) & res["item_id"].astype(str).isin(set(ids))]
    g = item_grid_from_results(sub, b)
    out = {}
    for (a, m2), v in rep.items():
        pn = pair_null(g, g.models.index(a), g.models.index(m2), samples, seed, tol)
        out[(a, m2)] = {f"rho_flip_{k}": x for k, x in null_summary(pn.null_rho, v, pn.draws).items()}
    bn = bench_null(g, samples, seed, tol)
    out["max"] = {f"rho_flip_{k}": x for k, x in null_summary(bn.null["max_rho_flip"], rep_max, bn.draws).items()}
    return out


def _max_rho_noise(res: pd.DataFrame, b: str, configs: list[str], first_max: dict, full_rho: dict,
                   samples: int, seed: int, tol) -> dict:
    """Noise reference of the max rho_flip on all items and on the first subsample (``first_max``:
    that repeat's reference, already computed by :func:`_repeat_noise`)."""
    bn = bench_null(item_grid_from_results(res[res["config"].isin(configs)], b), samples, seed, tol)
    nul = null_summary(bn.null["max_rho_flip"], max(full_rho.values()), bn.draws)
    out = {f"max_rho_flip_{k}_all_items": v for k, v in nul.items()}
    out |= {f"max_rho_flip_{k}_sub": first_max[f"rho_flip_{k}"] for k in nul}
    out["noise_note"] = ""
    return out


def _parity_scored(benchmark: str) -> bool:
    """True when the benchmark's task scores cells by CrowS-Pairs' parity distance."""
    return not score_is_item_mean(benchmark)


def read_item_table(items_dir: str | Path, benchmark: str) -> pd.DataFrame:
    path = Path(items_dir) / f"{benchmark}.parquet"
    if not path.exists():
        raise DataError(path, f"item table of benchmark {benchmark!r} not found")
    t, _ = read_parquet(path)
    df = t.to_pandas()
    for col in ("item_id", "stratum"):
        if col not in df.columns:
            raise DataError(path, f"missing column '{col}'")
    df["item_id"] = df["item_id"].astype(str)
    return df


def write_subsample_stability(item_results_path: str | Path, items_dir: str | Path, out_dir: str | Path,
                              fraction: float = 0.8, repeats: int = 20, seed: int = 0, *,
                              rules_path: str | Path | None = None, tol: float = 0.0,
                              noise_samples: int | None = None) -> dict[str, Path]:
    """``subsample_stability`` (per benchmark), ``subsample_cells`` (per cell) and
    ``subsample_rho_flip`` (per benchmark, pair and repeat) tables."""
    path = Path(item_results_path)
    cols = ["model", "benchmark", "config", "seed", "item_id", "correct"]
    results, meta = load_item_results(path, cols)
    parity = {b for b in results["benchmark"].unique() if _parity_scored(b)}
    if parity:  # the parity-distance score needs each pair's parsed label
        results, meta = load_item_results(path, cols + ["parsed_label"])
    rules = load_rules(rules_path)
    check_rules_file(rules, path, meta)
    benches = sorted(results["benchmark"].unique())
    items = {b: read_item_table(items_dir, b) for b in benches}
    core = {(b, c) for b, c in set(zip(results["benchmark"], results["config"]))
            if is_core(rules, config_of(rules, c))}
    ns = noise_samples or DEFAULT_SAMPLES
    summary, cells, rhos = subsample_stability(results, items, core, fraction, repeats, seed, tol, progress=True,
                                               parity=parity, noise_samples=ns)
    params = {"fraction": fraction, "repeats": repeats, "seed": seed, "tol": tol, "noise_samples": ns,
              "seeds_used": f"{seed}..{seed + repeats - 1}", "items_dir": str(items_dir)}
    tables = {"subsample_stability": summary, "subsample_cells": cells, "subsample_rho_flip": rhos}
    return write_tables("subsample", tables, out_dir, lambda name: output_metadata(name, [(path, meta)], params))
