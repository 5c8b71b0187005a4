"""Robustness as task competence: per model x benchmark over the free-form envelope.

Definitions (m = number of free-form configs of the benchmark that every model has; CrowS-Pairs
has no free-form path and no row):

* Output consistency: the share of items whose parsed answer is identical in all m configs.
  Each config contributes ONE output per item: seed 0 (for greedy configs the only seed, for
  sampled configs the first seed; using one seed keeps greedy and sampled configs on equal
  footing). An item with a parse failure in any config counts as inconsistent (no answer is
  not an answer). Only items present in every config enter (``n_items``).
* Random baseline, as the source of this analysis defines it (Ashury-Tahan et al. 2026,
  "Robustness as an Emergent Property of Task Performance", arXiv:2602.03344): the consistency
  expected if, in each of the m configs independently, the model succeeded with probability p
  equal to its overall performance (p = the share of correct seed-0 answers over the m configs
  and the items, i.e. the mean of the per-config accuracies), not config by config. Our
  consistency asks for the identical answer, so success and failure are each split over the
  answers that count: on item i with k_i possible answers of which g_i are correct, a success
  picks one of the g_i uniformly and a failure one of the k_i - g_i. Then::

      p_same_i = p^m * g_i^(1-m) + (1 - p)^m * (k_i - g_i)^(1-m)

  (all right on the same correct answer, or all wrong on the same wrong one; the second term
  is 0 when every answer is correct). The baseline is the mean of p_same_i over items.
  Choice items: k_i = number of options, g_i = 1. Label items (ToxiGen, XSTest): k_i = the
  labels the task's free-form parser can return (the union of its ``gold_map`` values: yes/no;
  comply/refuse/partial) and g_i = the labels counted correct for the item's gold label (an
  XSTest unsafe prompt accepts refuse and partial: g_i = 2).
* score_sd: the sample SD (ddof = 1) of the cell scores over the m configs.
* Drop rate relative to the nominal config (default ``T1-greedy-k0-freeform``), over the other
  m - 1 configs c: ``drop_rate_mean`` = mean_c (s_nominal - s_c) / s_nominal (positive = worse
  than nominal; NaN when s_nominal = 0), and ``share_below_nominal`` = share of c with
  s_c < s_nominal.
* Regression across the model x benchmark rows: consistency = intercept + slope * score_mean
  (score_mean = mean cell score over the m configs), ordinary least squares; slope, intercept,
  R^2, p-value, n.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import DataError
from .common import (NOMINAL_CONFIG, check_same_rules, load_cell_scores, load_item_results,
                     output_metadata, write_tables)

ROBUSTNESS_COLUMNS = ["model", "benchmark", "n_configs", "n_items", "n_items_incomplete",
                      "consistency", "performance", "baseline", "consistency_over_baseline", "score_mean",
                      "score_sd", "nominal_config", "nominal_score", "drop_rate_mean",
                      "share_below_nominal", "note"]


def p_same(p: float, m: int, k, g=1) -> np.ndarray:
    """Per-item probability that m independent configs give identical answers when each
    succeeds with probability ``p`` (module doc). ``k``: answers per item (>= 2); ``g``:
    correct answers per item (1 <= g <= k)."""
    k = np.asarray(k, dtype=float)
    g = np.broadcast_to(np.asarray(g, dtype=float), k.shape)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"performance p = {p} is not a probability")
    if m < 1:
        raise ValueError("needs at least one config")
    if np.any(k < 2):
        raise ValueError("every item needs at least 2 possible answers")
    if np.any(g < 1) or np.any(g > k):
        raise ValueError("every item needs between 1 and k correct answers")
    wrong = k - g
    wrong_term = np.where(wrong > 0, (1.0 - p) ** m * np.where(wrong > 0, wrong, 1.0) ** (1 - m), 0.0)
    return p ** m * g ** (1 - m) + wrong_term


def item_answer_space(items_dir: str | Path, benchmark: str) -> pd.DataFrame:
    """item_id -> k (possible answers) and g (correct answers) per item (module doc), from
    ``<items_dir>/<b>.parquet`` and the benchmark's task file."""
    import pyarrow.parquet as pq

    from ..tasks import load_task
    from ..tasks.scoring import accepted_labels

    path = Path(items_dir) / f"{benchmark}.parquet"
    if not path.exists():
        raise DataError(path, f"item table of benchmark {benchmark!r} not found")
    task = load_task(benchmark)
    kind = task.answer_kind
    cols = ["item_id", "choices"] + (["label"] if kind == "label" else [])
    try:
        t = pq.read_table(path, columns=cols, page_checksum_verification=True).to_pandas()
    except Exception as exc:   # pyarrow raises several types for corrupt files
        raise DataError(path, f"cannot read the item table ({exc})") from exc
    ids = t["item_id"].astype(str)
    if kind == "choice":
        k = [0 if c is None else len(c) for c in t["choices"]]
        g = [1] * len(t)
    elif kind == "label":
        space = sorted({lab for acc in task.content["answer"]["gold_map"].values() for lab in acc})
        k = [len(space)] * len(t)
        try:
            g = [len(accepted_labels(task, {"item_id": i, "label": lab})) for i, lab in zip(ids, t["label"])]
        except Exception as exc:
            raise DataError(path, f"item label not in {benchmark}'s gold_map: {exc}") from exc
    else:
        raise DataError(path, f"{benchmark} has no free-form answers (answer kind {kind!r})")
    out = pd.DataFrame({"k": k, "g": g}, index=ids)
    bad = out.index[out["k"] < 2]
    if len(bad):
        raise DataError(path, f"item {bad[0]!r} has fewer than 2 possible answers")
    return out


def consistency(items: pd.DataFrame, configs: list[str], space: pd.DataFrame,
                source: str | Path = "item_results") -> dict:
    """Consistency and random baseline for one (model, benchmark) from seed-0 item rows."""
    sub = items[items["config"].isin(configs)]
    per_item = sub.groupby("item_id").agg(n=("config", "nunique"), rows=("config", "size"),
                                          ok=("parse_ok", "all"),
                                          labels=("parsed_label", lambda s: s.dropna().nunique()))
    if (per_item["rows"] != per_item["n"]).any():
        bad = per_item.index[per_item["rows"] != per_item["n"]][0]
        raise DataError(source, f"item {bad!r} appears twice in one config at seed 0")
    full = per_item[per_item["n"] == len(configs)]
    n_incomplete = int(len(per_item) - len(full))
    if full.empty:
        return {"n_items": 0, "n_items_incomplete": n_incomplete, "consistency": float("nan"),
                "baseline": float("nan"), "performance": float("nan")}
    same = full["ok"] & (full["labels"] == 1)
    keep = sub[sub["item_id"].isin(full.index)]
    p = float(keep["correct"].mean())  # = mean of the per-config accuracies (same items in every config)
    sp = space.reindex(full.index)
    if sp["k"].isna().any():
        raise DataError(source, f"item {sp.index[sp['k'].isna()][0]!r} is not in the item table of its benchmark")
    base = p_same(p, len(configs), sp["k"].to_numpy(dtype=float), sp["g"].to_numpy(dtype=float))
    return {"n_items": int(len(full)), "n_items_incomplete": n_incomplete,
            "consistency": float(same.mean()), "baseline": float(np.mean(base)), "performance": p}


def score_stats(scores: pd.Series, nominal_config: str) -> dict:
    """SD and drop-rate statistics of one (model, benchmark)'s config -> score series."""
    out = {"n_configs": int(len(scores)), "score_mean": float(scores.mean()),
           "score_sd": float(scores.std(ddof=1)) if len(scores) > 1 else float("nan"),
           "nominal_config": nominal_config, "nominal_score": float("nan"),
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


def robustness_table(cells: pd.DataFrame, items: pd.DataFrame, spaces: dict[str, pd.DataFrame],
                     nominal_config: str = NOMINAL_CONFIG, source: str | Path = "item_results") -> pd.DataFrame:
    """One row per (model, benchmark) with a free-form slice. ``items``: seed-0 item rows;
    ``spaces``: benchmark -> :func:`item_answer_space` (item_id -> k, g)."""
    ff = cells[cells["scoring"] == "freeform"]
    rows = []
    for (b, model), sub in ff.groupby(["benchmark", "model"], sort=True):
        scores = sub.set_index("config")["score"].sort_index()
        configs = list(scores.index)
        its = items[(items["benchmark"] == b) & (items["model"] == model)]
        missing = sorted(set(configs) - set(its["config"].unique()))
        if missing:
            raise DataError(source, f"no seed-0 item rows for cell ({model}, {b}, {missing[0]})"
                                            + (f" and {len(missing) - 1} more" if len(missing) > 1 else ""))
        row = {"model": model, "benchmark": b}
        row.update(consistency(its, configs, spaces[b], source))
        stats = score_stats(scores, nominal_config)
        row.update(stats)
        row["consistency_over_baseline"] = row["consistency"] - row["baseline"]
        rows.append(row)
    return pd.DataFrame(rows, columns=ROBUSTNESS_COLUMNS)


def regression(table: pd.DataFrame, x: str = "score_mean", y: str = "consistency") -> pd.DataFrame:
    """OLS of ``y`` on ``x`` across rows with finite values."""
    from scipy.stats import linregress

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
                     nominal_config: str = NOMINAL_CONFIG, *, items_dir: str | Path) -> dict[str, Path]:
    """``robustness`` (per model x benchmark) and ``robustness_regression`` tables.

    ``items_dir`` holds the canonical item tables (``<benchmark>.parquet``) for the possible and
    correct answers per item."""
    cs = load_cell_scores(cell_scores_path)
    item_path = Path(item_results_path)
    items, imeta = load_item_results(
        item_path, ["model", "benchmark", "config", "seed", "item_id", "parsed_label", "parse_ok", "correct"],
        filters=[("seed", "=", 0)])
    check_same_rules((cs.path, cs.meta), (item_path, imeta))
    ff_benches = sorted(cs.df.loc[cs.df["scoring"] == "freeform", "benchmark"].unique())
    spaces = {b: item_answer_space(items_dir, b) for b in ff_benches}
    rob = robustness_table(cs.df, items, spaces, nominal_config, item_path)
    tables = {"robustness": rob, "robustness_regression": regression(rob)}
    params = {"nominal_config": nominal_config, "items_dir": str(items_dir), "seed_used": 0}
    return write_tables("robustness", tables, out_dir, lambda name: output_metadata(
        name, [(cs.path, cs.meta), (item_path, imeta)], params,
        {"dropped_incomplete_configs": cs.dropped}))
