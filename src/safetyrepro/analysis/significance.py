"""The analysis stage's item-level significance tables (definitions:
:mod:`safetyrepro.metrics.significance`): ``significance`` (per pair), ``significance_configs``
(per config), ``significance_benchmarks`` (per benchmark) and ``bootstrap_items``.

The item results must reproduce the validated cell-score table's exact scores before any test
runs, so the tests describe exactly the cells the verdicts are counted on.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from ..errors import DataError
from ..metrics.compare import tie_rule
from ..metrics.itemgrid import grids_for
from ..metrics.significance import CORRECTIONS, Settings, significance_tables
from ..tasks import score_is_item_mean
from .common import check_same_rules, load_cell_scores, load_item_results, output_metadata, write_tables


def write_significance(cell_scores_path: str | Path, item_results_path: str | Path, out_dir: str | Path, *,
                       alpha: float = 0.05, samples: int | None = None, seed: int = 0, family: str = "pair",
                       correction: str = "maxt", tol: float | None = None) -> dict[str, Path]:
    cs = load_cell_scores(cell_scores_path)
    ipath = Path(item_results_path)
    results, imeta = load_item_results(ipath, ["model", "benchmark", "config", "seed", "item_id", "correct"])
    check_same_rules((cs.path, cs.meta), (ipath, imeta))

    # a cell score that is not a mean over items (CrowS-Pairs' parity distance) has no paired item test
    skipped = {b: "cell score is not a mean over items (parity_distance convention)"
               for b in sorted(cs.df["benchmark"].unique()) if not score_is_item_mean(b)}
    grids = grids_for(cs.df[~cs.df["benchmark"].isin(list(skipped))], results, str(ipath))
    settings = Settings(alpha, samples, seed, tol, family, correction)
    warnings: list[str] = []
    try:
        tables = significance_tables(grids, settings, table="significance", warnings=warnings)
    except ValueError as exc:
        raise DataError(ipath, str(exc)) from None
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    sig = tables["significance"]
    params = {"alpha": alpha, "samples": int(sig["samples"].max()) if len(sig) else samples,
              "samples_requested": samples, "seed": seed, "family": family, "correction": CORRECTIONS[correction],
              "tol": tol, "tie_rule": tie_rule(tol, exact=all(g.exact for g in grids)).as_dict(),
              "n_items": {g.benchmark: g.n_items for g in grids}, "skipped_benchmarks": skipped,
              "warnings": warnings}
    return write_tables("significance", tables, out_dir, lambda name: output_metadata(
        name, [(cs.path, cs.meta), (ipath, imeta)], params, {"dropped_incomplete_configs": cs.dropped}))


__all__ = ["grids_for", "write_significance"]
