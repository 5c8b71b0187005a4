"""Per-benchmark tables of the flip metrics from a long score table.

Input: a pandas DataFrame with columns ``model, benchmark, config, score`` (one row per
(model, benchmark, config); validated by :mod:`safetyrepro.certify`). Model pairs are taken
in sorted order of model name: (A, B) with A < B; N+ counts configs where A scores higher."""

from __future__ import annotations

import itertools

import pandas as pd

from .flips import orderings, pair_stats, tau_r
from .order_change import order_change_rate

PAIR_COLUMNS = ["benchmark", "model_a", "model_b", "n_plus", "n_minus", "n_zero", "n_configs",
                "rho_flip", "ceiling", "saturated", "d1", "d2"]
SUMMARY_COLUMNS = ["benchmark", "n_models", "n_configs", "max_rho_flip", "max_pair",
                   "orderings_reachable", "orderings_possible", "tied_configs", "tau_r",
                   "tau_pairs_used", "tau_pairs_undefined", "order_change_rate", "order_change_null"]


def score_matrix(df: pd.DataFrame, benchmark: str, configs=None) -> pd.DataFrame:
    """configs x models matrix of scores for one benchmark (optionally restricted)."""
    sub = df[df["benchmark"] == benchmark]
    if configs is not None:
        sub = sub[sub["config"].isin(list(configs))]
    mat = sub.pivot(index="config", columns="model", values="score")
    return mat.sort_index().reindex(sorted(mat.columns), axis=1)


def pairwise_table(df: pd.DataFrame, configs=None, tol: float = 0.0) -> pd.DataFrame:
    rows = []
    for b in sorted(df["benchmark"].unique()):
        mat = score_matrix(df, b, configs)
        if mat.empty:
            continue
        for a, m in itertools.combinations(mat.columns, 2):
            rows.append({"benchmark": b, "model_a": a, "model_b": m,
                         **pair_stats(mat[a].to_numpy(), mat[m].to_numpy(), tol)})
    return pd.DataFrame(rows, columns=PAIR_COLUMNS)


def benchmark_summary(df: pd.DataFrame, configs=None, tol: float = 0.0) -> pd.DataFrame:
    pairs = pairwise_table(df, configs, tol)
    rows = []
    for b in sorted(df["benchmark"].unique()):
        mat = score_matrix(df, b, configs)
        if mat.empty:
            continue
        cols = {m: mat[m].to_numpy() for m in mat.columns}
        ords = orderings(cols, tol)
        tau = tau_r(cols)
        change = order_change_rate(cols, tol) if len(cols) > 1 else {"order_change_rate": float("nan"),
                                                                     "null_rate": float("nan")}
        pb = pairs[pairs["benchmark"] == b]
        if len(pb):
            best = pb.loc[pb["rho_flip"].idxmax()]
            max_rho, max_pair = float(best["rho_flip"]), f"{best['model_a']} vs {best['model_b']}"
        else:
            max_rho, max_pair = float("nan"), ""
        rows.append({"benchmark": b, "n_models": mat.shape[1], "n_configs": mat.shape[0],
                     "max_rho_flip": max_rho, "max_pair": max_pair,
                     "orderings_reachable": ords["reachable"], "orderings_possible": ords["possible"],
                     "tied_configs": ords["tied_configs"], "tau_r": tau["tau_r"],
                     "tau_pairs_used": tau["pairs_used"], "tau_pairs_undefined": tau["pairs_undefined"],
                     "order_change_rate": change["order_change_rate"], "order_change_null": change["null_rate"]})
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)
