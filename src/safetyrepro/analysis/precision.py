"""BF16 vs NF4: does the main run's 4-bit quantization move scores or verdicts?

Cells of the main table and of a BF16 rerun are paired on (model, benchmark, config) over the
precision check's configs (:func:`safetyrepro.grid.precision_configs`). Per benchmark and over
all (``"ALL"``): median / mean / max |score_main - score_bf16|, and on how many paired configs
the model ordering matches, compared as rank vectors with ties, so a tie in one table and a
strict order in the other is a mismatch. Definitions: docs/VERDICTS.md section 8.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import DataError
from ..grid import PRECISION_ENVELOPE, precision_configs
from ..rules import Rules, load_rules
from ..metrics.compare import scores_of
from .common import check_rules_file, check_same_rules, load_cell_scores, output_metadata, weak_ranks, write_tables

SUB_ENVELOPE = PRECISION_ENVELOPE
SUMMARY_COLUMNS = ["benchmark", "n_cells_paired", "n_cells_main_only", "n_cells_bf16_only",
                   "abs_diff_median", "abs_diff_mean", "abs_diff_max", "n_configs_paired",
                   "n_orderings_match", "share_orderings_match", "orderings_agree", "quantization_main",
                   "quantization_bf16"]


def checked_configs(rules: Rules, benchmarks) -> set[tuple[str, str]]:
    """The (benchmark, config id) pairs of the precision check among ``benchmarks``."""
    return {(b, c.id) for b in set(benchmarks) for c in precision_configs(rules, b, SUB_ENVELOPE)}


def _quant(df: pd.DataFrame) -> str:
    return ",".join(sorted(df["quantization"].astype(str).unique())) if "quantization" in df else ""


def precision_check(main: pd.DataFrame, bf16: pd.DataFrame, rules: Rules,
                    tol: float = 0.0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(summary per benchmark + ALL, paired cells)."""
    keys = ["model", "benchmark", "config"]

    checked = checked_configs(rules, set(main["benchmark"]) | set(bf16["benchmark"]))

    def restrict(d: pd.DataFrame) -> pd.DataFrame:
        mask = [(b, c) in checked for b, c in zip(d["benchmark"], d["config"])]
        return d[np.array(mask, dtype=bool)] if len(d) else d

    m, f = restrict(main), restrict(bf16)
    both = m.merge(f, on=keys, how="outer", suffixes=("_main", "_bf16"), indicator=True)
    paired = both[both["_merge"] == "both"].copy()
    paired["abs_diff"] = (paired["score_main"] - paired["score_bf16"]).abs()
    cells = paired[keys + ["score_main", "score_bf16", "abs_diff"]].sort_values(keys).reset_index(drop=True)
    models_main = m.groupby("benchmark")["model"].agg(lambda s: set(s))

    def summarise(label: str, sel: pd.DataFrame, pb: pd.DataFrame, mm: pd.DataFrame, ff: pd.DataFrame) -> dict:
        row = {"benchmark": label, "n_cells_paired": len(pb),
               "n_cells_main_only": int((sel["_merge"] == "left_only").sum()),
               "n_cells_bf16_only": int((sel["_merge"] == "right_only").sum()),
               "abs_diff_median": float(pb["abs_diff"].median()) if len(pb) else float("nan"),
               "abs_diff_mean": float(pb["abs_diff"].mean()) if len(pb) else float("nan"),
               "abs_diff_max": float(pb["abs_diff"].max()) if len(pb) else float("nan"),
               "quantization_main": _quant(mm), "quantization_bf16": _quant(ff)}
        n_cfg = n_match = 0
        for (b, c), g in pb.groupby(["benchmark", "config"]):
            if set(g["model"]) != models_main.get(b, set()) or len(g) < 2:
                continue  # a model lacks this config in one of the tables
            g = g.sort_values("model")
            n_cfg += 1
            n_match += weak_ranks(scores_of(g, "_main"), tol) == weak_ranks(scores_of(g, "_bf16"), tol)
        row.update(n_configs_paired=n_cfg, n_orderings_match=n_match,
                   share_orderings_match=n_match / n_cfg if n_cfg else float("nan"),
                   orderings_agree=f"{n_match} of {n_cfg}")
        return row

    rows = []
    for b in sorted(set(m["benchmark"]) | set(f["benchmark"])):
        rows.append(summarise(b, both[both["benchmark"] == b], paired[paired["benchmark"] == b],
                              m[m["benchmark"] == b], f[f["benchmark"] == b]))
    rows.append(summarise("ALL", both, paired, m, f))
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS), cells


def write_precision_check(main_scores_path: str | Path, bf16_scores_path: str | Path, out_dir: str | Path,
                          *, rules_path: str | Path | None = None, tol: float = 0.0) -> dict[str, Path]:
    """``precision`` (summary) and ``precision_cells`` (paired cells) tables."""
    main = load_cell_scores(main_scores_path)
    bf16 = load_cell_scores(bf16_scores_path)
    check_same_rules((main.path, main.meta), (bf16.path, bf16.meta))
    rules = load_rules(rules_path)
    check_rules_file(rules, main.path, main.meta)
    summary, cells = precision_check(main.df, bf16.df, rules, tol)
    if summary.loc[summary["benchmark"] == "ALL", "n_cells_paired"].iloc[0] == 0:
        raise DataError(bf16.path, f"no precision-check ({SUB_ENVELOPE}) cell pairs with {main.path}")
    params = {"sub_envelope": SUB_ENVELOPE, "tol": tol,
              "configs": sorted(f"{b}/{c}" for b, c in checked_configs(rules, main.df["benchmark"]))}
    return write_tables("precision", {"precision": summary, "precision_cells": cells}, out_dir,
                        lambda name: output_metadata(name, [(main.path, main.meta), (bf16.path, bf16.meta)],
                                                     params))
