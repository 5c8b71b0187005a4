"""The analysis stage's item-level significance tables (definitions in
:mod:`safetyrepro.metrics.significance`): ``significance`` (per benchmark and pair: rho_flip
beside rho_flip_sig, N+_sig/N-_sig, the crossover test), ``significance_configs`` (per config:
paired difference, SE, test, p, Holm p) and ``bootstrap_items`` (rho_flip intervals that
resample items; the ``bootstrap`` table of :mod:`.tables` resamples configurations).

The configs are those of the validated cell-score table (configs every model has); the item
results must reproduce its exact cell scores (score_num/score_den) before any test is run, so
the significance columns can only describe the cells the verdicts are counted on.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..errors import DataError
from ..metrics.compare import has_exact, tie_rule
from ..metrics.significance import item_grid_from_results, significance_tables
from .common import check_same_rules, load_cell_scores, load_item_results, output_metadata, write_tables


def grids_for(cells: pd.DataFrame, results: pd.DataFrame, where: str = "item_results") -> list:
    """Item grids of every benchmark, restricted to the cell table's configs and checked
    against its exact scores."""
    grids = []
    for b in sorted(cells["benchmark"].unique()):
        cb = cells[cells["benchmark"] == b]
        rb = results[(results["benchmark"] == b) & results["config"].isin(set(cb["config"]))]
        if rb.empty:
            raise DataError(where, f"no item results for benchmark {b!r}")
        try:
            g = item_grid_from_results(rb, b, where)
        except ValueError as exc:
            raise DataError(where, str(exc)) from None
        if g.models != sorted(cb["model"].unique()) or g.configs != sorted(cb["config"].unique()):
            raise DataError(where, f"benchmark {b!r}: item results cover models {g.models} x {len(g.configs)} "
                                   f"configs, the cell scores {sorted(cb['model'].unique())} x "
                                   f"{cb['config'].nunique()}")
        if has_exact(cb):
            sc = g.cell_scores()
            want = cb.set_index(["model", "config"])
            for i, m in enumerate(g.models):
                for j, c in enumerate(g.configs):
                    r = want.loc[(m, c)]
                    if (int(sc.num[i, j]), int(sc.den[i, j])) != (int(r["score_num"]), int(r["score_den"])):
                        raise DataError(where, f"({m}, {b}, {c}): item results give {sc.num[i, j]}/{sc.den[i, j]}, "
                                               f"the cell scores {r['score_num']}/{r['score_den']}: the two tables "
                                               "come from different aggregations")
        grids.append(g)
    return grids


def write_significance(cell_scores_path: str | Path, item_results_path: str | Path, out_dir: str | Path, *,
                       alpha: float = 0.05, samples: int = 1000, seed: int = 0,
                       tol: float | None = None) -> dict[str, Path]:
    cs = load_cell_scores(cell_scores_path)
    ipath = Path(item_results_path)
    results, imeta = load_item_results(ipath, ["model", "benchmark", "config", "seed", "item_id", "correct"])
    check_same_rules((cs.path, cs.meta), (ipath, imeta))
    from ..tasks import score_is_item_mean

    # a cell score that is not a mean over items (CrowS-Pairs' parity distance) has no paired item test
    skipped = {b: "cell score is not a mean over items (parity_distance convention)"
               for b in sorted(cs.df["benchmark"].unique()) if not score_is_item_mean(b)}
    grids = grids_for(cs.df[~cs.df["benchmark"].isin(list(skipped))], results, str(ipath))
    tables = significance_tables(grids, alpha, samples, seed, tol)
    params = {"alpha": alpha, "bootstrap_samples": samples, "bootstrap_seed": seed, "tol": tol,
              "tie_rule": tie_rule(tol, exact=all(g.exact for g in grids)).as_dict(),
              "correction": "holm over configs per (benchmark, pair)",
              "n_items": {g.benchmark: g.n_items for g in grids}, "skipped_benchmarks": skipped}
    return write_tables("significance", tables, out_dir, lambda name: output_metadata(
        name, [(cs.path, cs.meta), (ipath, imeta)], params, {"dropped_incomplete_configs": cs.dropped}))


__all__ = ["grids_for", "write_significance"]
