"""Per-benchmark tables of the flip metrics from a long score table.

Input: columns ``model, benchmark, config, score`` (validated by :mod:`safetyrepro.certify`),
optionally the exact fractions ``score_num, score_den`` (then every sign is exact,
:mod:`.compare`). Pairs are (A, B) with A < B by name; N+ counts configs where A is ahead."""

from __future__ import annotations

import itertools
from pathlib import Path

import pandas as pd

from ..analysis.outputs import rho_flip_files
from ..io import read_parquet, write_csv, write_parquet
from ..provenance import code_stamp, code_version
from .compare import rule_for, score_grid
from .flips import orderings, pair_stats, tau_r
from .order_change import order_change_rate

PAIR_COLUMNS = ["benchmark", "model_a", "model_b", "n_plus", "n_minus", "n_zero", "n_configs",
                "rho_flip", "ceiling", "saturated", "d1", "d2", "tie_rule"]
SUMMARY_COLUMNS = ["benchmark", "n_models", "n_configs", "max_rho_flip", "max_pair",
                   "orderings_reachable", "orderings_possible", "tied_configs", "tau_r",
                   "tau_pairs_used", "tau_pairs_undefined", "order_change_rate", "order_change_null", "tie_rule"]


def score_matrix(df: pd.DataFrame, benchmark: str, configs=None) -> pd.DataFrame:
    """configs x models matrix of float scores for one benchmark (for display; comparisons
    use :func:`.compare.score_grid`, which keeps the exact fractions)."""
    sub = df[df["benchmark"] == benchmark]
    if configs is not None:
        sub = sub[sub["config"].isin(list(configs))]
    mat = sub.pivot(index="config", columns="model", values="score")
    return mat.sort_index().reindex(sorted(mat.columns), axis=1)


def pairwise_table(df: pd.DataFrame, configs=None, tol: float | None = None) -> pd.DataFrame:
    rows = []
    for b in sorted(df["benchmark"].unique()):
        g = score_grid(df, b, configs)
        if g.empty:
            continue
        cols = g.columns()
        rule = rule_for(cols, tol).kind
        for a, m in itertools.combinations(g.models, 2):
            rows.append({"benchmark": b, "model_a": a, "model_b": m,
                         **pair_stats(cols[a], cols[m], tol), "tie_rule": rule})
    return pd.DataFrame(rows, columns=PAIR_COLUMNS)


def benchmark_summary(df: pd.DataFrame, configs=None, tol: float | None = None) -> pd.DataFrame:
    pairs = pairwise_table(df, configs, tol)
    rows = []
    for b in sorted(df["benchmark"].unique()):
        g = score_grid(df, b, configs)
        if g.empty:
            continue
        cols = g.columns()
        ords = orderings(cols, tol)
        tau = tau_r(cols, tol)
        change = order_change_rate(cols, tol) if len(cols) > 1 else {"order_change_rate": float("nan"),
                                                                     "null_rate": float("nan")}
        pb = pairs[pairs["benchmark"] == b]
        if len(pb):
            best = pb.loc[pb["rho_flip"].idxmax()]
            max_rho, max_pair = float(best["rho_flip"]), f"{best['model_a']} vs {best['model_b']}"
        else:
            max_rho, max_pair = float("nan"), ""
        rows.append({"benchmark": b, "n_models": len(g.models), "n_configs": len(g.configs),
                     "max_rho_flip": max_rho, "max_pair": max_pair,
                     "orderings_reachable": ords["reachable"], "orderings_possible": ords["possible"],
                     "tied_configs": ords["tied_configs"], "tau_r": tau["tau_r"],
                     "tau_pairs_used": tau["pairs_used"], "tau_pairs_undefined": tau["pairs_undefined"],
                     "order_change_rate": change["order_change_rate"], "order_change_null": change["null_rate"],
                     "tie_rule": rule_for(cols, tol).kind})
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


def write_pairwise_table(cell_scores, out) -> pd.DataFrame:
    """The run's ``rho_flip.parquet`` (stamped with its source's stamps and this code's
    fingerprint) and a CSV beside it, from ``cell_scores.parquet``; returns the table."""
    cell_scores, out = Path(cell_scores), Path(out)
    table, meta = read_parquet(cell_scores)
    df = table.to_pandas()
    pairs = pairwise_table(df[[c for c in ("model", "benchmark", "config", "score", "score_num", "score_den")
                               if c in df.columns]])
    md = {k: meta.get(k) for k in ("rules_stamp", "config_hash", "subset_hashes")}
    md |= {"kind": "rho_flip", "source": str(cell_scores), "code_version": code_version(),
           **code_stamp(__name__),
           "sources": [{"path": str(cell_scores), "producer": meta.get("producer"),
                        "code_fingerprint": meta.get("code_fingerprint")}]}
    files = rho_flip_files(out)
    write_parquet(pairs, files["pairs"], md)
    write_csv(pairs, files["csv"])
    return pairs
