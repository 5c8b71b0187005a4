"""Robustness as task competence (Ashury-Tahan et al. 2026, arXiv:2602.03344), per model x
benchmark over its envelope (docs/VERDICTS.md section 7).

A row covers the benchmark's m free-form configs the model has (CrowS-Pairs: its logprob
configs). Consistency: the share of items correct in all m configs, one answer (seed 0) per
config so greedy and sampled configs weigh the same; the random baseline p^m with p the
seed-0 accuracy at the nominal config (or its unique nearest stand-in,
:func:`safetyrepro.metrics.reversal.resolve_nominal`); score and per-item SDs (ddof 1); drop
rates against the nominal; and an OLS of consistency on the mean score across rows.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import DataError
from ..grid import Config
from ..metrics.reversal import resolve_nominal
from .common import (AXES, NOMINAL_CONFIG, check_same_rules, load_cell_scores, load_item_results,
                     output_metadata, write_tables)

ROBUSTNESS_COLUMNS = ["model", "benchmark", "scoring", "n_configs", "n_items", "n_items_incomplete",
                      "consistency", "answer_consistency", "performance", "baseline",
                      "consistency_over_baseline", "score_mean", "score_sd", "item_sd_mean", "item_sd_median",
                      "nominal_config", "nominal_used", "nominal_score", "drop_rate_mean",
                      "share_below_nominal", "note"]
ITEM_SD_QUANTILES = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0)
ITEM_SD_COLUMNS = (["model", "benchmark", "n_items", "mean"] + [f"q{round(100 * q):02d}" for q in ITEM_SD_QUANTILES]
                   + ["share_zero"])
ITEM_SD_BIN = 0.05  # histogram bin width; an SD of scores in [0, 1] over m >= 2 configs is <= 0.7072
ITEM_SD_HIST_COLUMNS = ["model", "benchmark", "bin_lo", "bin_hi", "n_items", "share"]


def random_baseline(p: float, m: int) -> float:
    """The paper's random baseline: ``p^m``, the chance that m independent configs, each
    correct with probability ``p``, are all correct."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"performance p = {p} is not a probability")
    if m < 1:
        raise ValueError("needs at least one config")
    return float(p ** m)


def consistency(items: pd.DataFrame, configs: list[str], nominal: str | None,
                source: str | Path = "item_results") -> dict:
    """Consistency, answer consistency, performance p (at config ``nominal``; None: no p) and
    the random baseline for one (model, benchmark) from its seed-0 item rows."""
    sub = items[items["config"].isin(configs)]
    per_item = sub.groupby("item_id").agg(n=("config", "nunique"), rows=("config", "size"),
                                          ok=("parse_ok", "all"), right=("correct", "all"),
                                          labels=("parsed_label", lambda s: s.dropna().nunique()))
    if (per_item["rows"] != per_item["n"]).any():
        bad = per_item.index[per_item["rows"] != per_item["n"]][0]
        raise DataError(source, f"item {bad!r} appears twice in one config at seed 0")
    full = per_item[per_item["n"] == len(configs)]
    out = {"n_items": int(len(full)), "n_items_incomplete": int(len(per_item) - len(full)),
           "consistency": float("nan"), "answer_consistency": float("nan"),
           "performance": float("nan"), "baseline": float("nan")}
    if full.empty:
        return out
    out["consistency"] = float(full["right"].mean())
    out["answer_consistency"] = float((full["ok"] & (full["labels"] == 1)).mean())
    if nominal is not None:
        at_nominal = sub[(sub["config"] == nominal) & sub["item_id"].isin(full.index)]
        out["performance"] = float(at_nominal["correct"].mean())
        out["baseline"] = random_baseline(out["performance"], len(configs))
    return out


def item_sd(items: pd.DataFrame, configs: list[str]) -> pd.Series:
    """item_id -> sample SD (ddof = 1) over ``configs`` of the item's score per config (the
    share of its correct answers over the config's seeds), for items present in every config."""
    sub = items[items["config"].isin(configs)]
    per = sub.groupby(["item_id", "config"])["correct"].mean().unstack("config")
    per = per.dropna()
    if len(configs) < 2:
        return pd.Series(np.nan, index=per.index, dtype=float)
    return per.std(axis=1, ddof=1).astype(float)


def item_sd_summary(model: str, benchmark: str, sd: pd.Series) -> tuple[dict, list[dict]]:
    """(quantile row, histogram rows) of one (model, benchmark)'s per-item SDs."""
    v = sd.dropna().to_numpy(dtype=float)
    row = {"model": model, "benchmark": benchmark, "n_items": int(v.size),
           "mean": float(v.mean()) if v.size else float("nan"),
           "share_zero": float(np.mean(v == 0.0)) if v.size else float("nan")}
    for q, col in zip(ITEM_SD_QUANTILES, ITEM_SD_COLUMNS[4:-1]):
        row[col] = float(np.quantile(v, q)) if v.size else float("nan")
    n_bins = int(np.ceil(np.sqrt(0.5) / ITEM_SD_BIN - 1e-9))
    edges = np.round(np.arange(n_bins + 1) * ITEM_SD_BIN, 10)
    # bins [lo, hi), the last one closed; v <= sqrt(1/2) < edges[-1] (values are in [0, 1])
    counts = np.histogram(v, bins=edges)[0] if v.size else np.zeros(n_bins, dtype=int)
    hist = [{"model": model, "benchmark": benchmark, "bin_lo": float(lo), "bin_hi": float(hi),
             "n_items": int(n), "share": float(n / v.size) if v.size else float("nan")}
            for lo, hi, n in zip(edges[:-1], edges[1:], counts)]
    return row, hist


def score_stats(scores: pd.Series, nominal_config: str, requested: str | None = None) -> dict:
    """SD and drop-rate statistics of one (model, benchmark)'s config -> score series, relative
    to ``nominal_config`` (the config standing in for ``requested``, default itself)."""
    out = {"n_configs": int(len(scores)), "score_mean": float(scores.mean()),
           "score_sd": float(scores.std(ddof=1)) if len(scores) > 1 else float("nan"),
           "nominal_config": requested or nominal_config, "nominal_score": float("nan"),
           "drop_rate_mean": float("nan"), "share_below_nominal": float("nan")}
    notes = []
    if nominal_config not in scores.index:
        notes.append(f"nominal config {nominal_config} missing")
    else:
        nom = float(scores[nominal_config])
        others = scores.drop(nominal_config).to_numpy(dtype=float)
        out["nominal_score"] = nom
        if others.size:
            out["share_below_nominal"] = float(np.mean(others < nom))
            if nom != 0:
                out["drop_rate_mean"] = float(np.mean((nom - others) / nom))
            else:
                notes.append("nominal score 0: drop rate undefined")
    out["note"] = "; ".join(notes)
    return out


def robustness_table(cells: pd.DataFrame, items: pd.DataFrame, nominal_config: str = NOMINAL_CONFIG,
                     source: str | Path = "item_results") -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(robustness, robustness_item_sd, robustness_item_sd_hist): one row (a histogram per)
    (model, benchmark). ``items``: item rows of every seed (consistency reads seed 0)."""
    try:
        nominal_levels = Config.parse(nominal_config).levels()
    except ValueError as exc:
        raise ValueError(f"analysis.nominal_config: {exc}") from None
    rows, sd_rows, hist_rows = [], [], []
    for (b, model), sub in cells.groupby(["benchmark", "model"], sort=True):
        scoring = "freeform" if (cells.loc[cells["benchmark"] == b, "scoring"] == "freeform").any() else "logprob"
        sub = sub[sub["scoring"] == scoring]
        scores = sub.set_index("config")["score"].sort_index()
        configs = list(scores.index)
        its = items[(items["benchmark"] == b) & (items["model"] == model)]
        missing = sorted(set(configs) - set(its.loc[its["seed"] == 0, "config"].unique()))
        if missing:
            raise DataError(source, f"no seed-0 item rows for cell ({model}, {b}, {missing[0]})"
                                    + (f" and {len(missing) - 1} more" if len(missing) > 1 else ""))
        levels = {c: {a: str(lv[a]) for a in AXES}
                  for c, lv in sub.drop_duplicates("config").set_index("config").iterrows()}
        used, note = resolve_nominal(levels, nominal_config, nominal_levels)
        row = {"model": model, "benchmark": b, "scoring": scoring}
        row.update(consistency(its[its["seed"] == 0], configs, used, source))
        row.update(score_stats(scores, used or nominal_config, nominal_config))
        row["nominal_used"] = used or ""
        row["note"] = "; ".join(n for n in (note, row["note"]) if n)
        row["consistency_over_baseline"] = row["consistency"] - row["baseline"]
        sd = item_sd(its, configs)
        summary, hist = item_sd_summary(model, b, sd)
        row["item_sd_mean"], row["item_sd_median"] = summary["mean"], summary["q50"]
        rows.append(row)
        sd_rows.append(summary)
        hist_rows += hist
    return (pd.DataFrame(rows, columns=ROBUSTNESS_COLUMNS), pd.DataFrame(sd_rows, columns=ITEM_SD_COLUMNS),
            pd.DataFrame(hist_rows, columns=ITEM_SD_HIST_COLUMNS))


def regression(table: pd.DataFrame, x: str = "score_mean", y: str = "consistency") -> pd.DataFrame:
    """OLS of ``y`` on ``x`` across rows with finite values."""
    from scipy.stats import linregress  # deferred: scipy.stats, this regression only

    d = table[[x, y]].astype(float)
    d = d[np.isfinite(d[x]) & np.isfinite(d[y])]
    row = {"x": x, "y": y, "n": len(d), "slope": float("nan"), "intercept": float("nan"),
           "r2": float("nan"), "p_value": float("nan"), "note": ""}
    if len(d) < 3:
        row["note"] = "fewer than 3 (model, benchmark) points: no regression"
    elif d[x].nunique() < 2:
        row["note"] = f"{x} constant: slope undefined"
    else:
        r = linregress(d[x].to_numpy(), d[y].to_numpy())
        row.update(slope=float(r.slope), intercept=float(r.intercept), r2=float(r.rvalue ** 2),
                   p_value=float(r.pvalue))
    return pd.DataFrame([row])


def write_robustness(cell_scores_path: str | Path, item_results_path: str | Path, out_dir: str | Path,
                     nominal_config: str = NOMINAL_CONFIG) -> dict[str, Path]:
    """``robustness`` (per model x benchmark), ``robustness_item_sd`` (per-item SD quantiles),
    ``robustness_item_sd_hist`` (its histogram) and ``robustness_regression`` tables."""
    cs = load_cell_scores(cell_scores_path)
    item_path = Path(item_results_path)
    items, imeta = load_item_results(
        item_path, ["model", "benchmark", "config", "seed", "item_id", "parsed_label", "parse_ok", "correct"])
    check_same_rules((cs.path, cs.meta), (item_path, imeta))
    rob, sd, hist = robustness_table(cs.df, items, nominal_config, item_path)
    tables = {"robustness": rob, "robustness_item_sd": sd, "robustness_item_sd_hist": hist,
              "robustness_regression": regression(rob)}
    params = {"nominal_config": nominal_config, "seed_used": 0, "item_sd_bin": ITEM_SD_BIN}
    return write_tables("robustness", tables, out_dir, lambda name: output_metadata(
        name, [(cs.path, cs.meta), (item_path, imeta)], params,
        {"dropped_incomplete_configs": cs.dropped}))
