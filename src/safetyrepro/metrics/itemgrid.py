"""One benchmark's item scores as arrays: the input of every item-level test and noise reference.

``ItemGrid.value[m, c, i]`` is model m's score on item i under config c (0/1 for a greedy or
logprob cell; a sampled cell's item score is its mean over seeds, k/s). Where the scores are
counts the grid keeps them exact (``num / den``), and :meth:`ItemGrid.common` puts every model
of a config on one denominator, so resampled cell scores are sums of small integers (exact in
float64) and their signs follow :mod:`.compare`'s exact rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from math import lcm

import numpy as np
import pandas as pd

from ..errors import DataError
from .compare import Scores, has_exact

MAX_ITEM_DEN = 1000          # item scores recovered as fractions k/q with q up to this
MAX_ABS_SCORE = 1e12         # larger item scores are refused (no score of a rate is near it)


@dataclass
class ItemGrid:
    """One benchmark's item scores: ``value[m, c, i]`` for model m, config c, item i; exact
    as ``num / den[m, c]`` (integers) when the item scores are counts (``num`` None if not)."""

    benchmark: str
    models: list[str]
    configs: list[str]
    items: list[str]
    value: np.ndarray
    num: np.ndarray | None = None
    den: np.ndarray | None = None

    @property
    def exact(self) -> bool:
        return self.num is not None

    @property
    def n_items(self) -> int:
        return len(self.items)

    def restrict(self, configs) -> "ItemGrid":
        """The grid on a subset of its configs (in this grid's order)."""
        keep = set(configs)
        idx = [j for j, c in enumerate(self.configs) if c in keep]
        return ItemGrid(self.benchmark, self.models, [self.configs[j] for j in idx], self.items,
                        self.value[:, idx], None if self.num is None else self.num[:, idx],
                        None if self.den is None else self.den[:, idx])

    def cell_scores(self, weights: np.ndarray | None = None) -> Scores:
        """Cell scores (models x configs, or draws x models x configs with item ``weights``
        of shape (draws, items) summing to n_items): the mean of the item scores."""
        n = self.n_items
        if weights is None:
            if self.exact:
                return Scores(num=self.num.sum(axis=2), den=self.den * n)
            return Scores(self.value.mean(axis=2))
        w = np.asarray(weights, dtype=float)
        m, c = len(self.models), len(self.configs)
        if self.exact:
            num = np.rint(w @ self.num.reshape(m * c, n).T.astype(float)).astype(np.int64)
            return Scores(num=num.reshape(-1, m, c), den=np.broadcast_to(self.den * n, (w.shape[0], m, c)))
        return Scores((w @ self.value.reshape(m * c, n).T / n).reshape(-1, m, c))


def _fractions(values: np.ndarray) -> tuple[np.ndarray, int] | None:
    """(integer numerators, common denominator) when every value is k/q with q <= MAX_ITEM_DEN
    (to the last bit); None otherwise."""
    uniq = np.unique(values)
    if uniq.size and np.abs(uniq).max() > MAX_ABS_SCORE:
        return None
    fr = {}
    for v in uniq:
        f = Fraction(float(v)).limit_denominator(MAX_ITEM_DEN)
        if f.numerator / f.denominator != float(v):
            return None
        fr[float(v)] = f
    den = 1
    for f in fr.values():
        den = lcm(den, f.denominator)
    if den > 10**6:
        return None
    lookup = {v: f.numerator * (den // f.denominator) for v, f in fr.items()}
    nums = np.vectorize(lambda v: lookup[float(v)], otypes=[np.int64])(values) if values.size else values.astype(np.int64)
    return nums, den


def _cube(df: pd.DataFrame, col: str, models, configs, items) -> np.ndarray:
    m = pd.Categorical(df["model"], categories=models).codes
    c = pd.Categorical(df["config"], categories=configs).codes
    i = pd.Categorical(df["item"], categories=items).codes
    out = np.full((len(models), len(configs), len(items)), np.nan)
    out[m, c, i] = df[col].to_numpy(dtype=float)
    return out


def item_grid_from_scores(df: pd.DataFrame, benchmark: str, where: str = "item table") -> ItemGrid:
    """From a long table ``model, config, item, score`` of one benchmark (one row per item; a
    sampled cell's item score is its seed mean). Every (model, config) must score the same
    items. Scores that are fractions k/q (q <= 1000) are kept exact."""
    models, configs = sorted(df["model"].unique()), sorted(df["config"].unique())
    items = sorted(df["item"].unique())
    value = _cube(df, "score", models, configs, items)
    big = np.abs(np.nan_to_num(value)) > MAX_ABS_SCORE
    if big.any():
        m, c, i = (int(x[0]) for x in np.nonzero(big))
        raise ValueError(f"{where}: benchmark {benchmark!r}: item score {value[m, c, i]!r} of model {models[m]!r} "
                         f"on item {items[i]!r}, config {configs[c]!r} is beyond +-{MAX_ABS_SCORE:g}")
    if np.isnan(value).any():
        m, c, i = (int(x[0]) for x in np.nonzero(np.isnan(value)))
        raise ValueError(f"{where}: benchmark {benchmark!r}: model {models[m]!r} has no score for item "
                         f"{items[i]!r} on config {configs[c]!r}; paired tests need every model to score "
                         "the same items on every config")
    fr = _fractions(value)
    if fr is None:
        return ItemGrid(benchmark, models, configs, items, value)
    nums, den = fr
    return ItemGrid(benchmark, models, configs, items, value, nums,
                    np.full((len(models), len(configs)), den, dtype=np.int64))


def item_grid_from_results(res: pd.DataFrame, benchmark: str, where: str = "item_results") -> ItemGrid:
    """From the aggregation's item results (``model, config, seed, item_id, correct``) of one
    benchmark: item score = correct answers over the cell's seeds / its number of seeds."""
    runs = res.groupby(["model", "config", "seed", "item_id"]).size()
    if (runs > 1).any():
        k = runs.index[runs > 1][0]
        raise ValueError(f"{where}: item {k[3]!r} appears twice in run {k[:3]}")
    g = res.groupby(["model", "config", "item_id"], sort=False).agg(k=("correct", "sum"), s=("seed", "nunique"))
    g = g.reset_index().rename(columns={"item_id": "item"})
    models, configs = sorted(g["model"].unique()), sorted(g["config"].unique())
    items = sorted(g["item"].unique())
    k = _cube(g, "k", models, configs, items)
    s = _cube(g, "s", models, configs, items)
    if np.isnan(k).any():
        m, c, i = (int(x[0]) for x in np.nonzero(np.isnan(k)))
        raise ValueError(f"{where}: benchmark {benchmark!r}: model {models[m]!r} has no result for item "
                         f"{items[i]!r} on config {configs[c]!r}")
    seeds = s[:, :, 0]
    if np.any(s != seeds[:, :, None]):
        m, c = (int(x[0]) for x in np.nonzero(np.any(s != seeds[:, :, None], axis=2)))
        raise ValueError(f"{where}: ({models[m]}, {benchmark}, {configs[c]}): items scored by different "
                         "numbers of seeds")
    num, den = k.astype(np.int64), seeds.astype(np.int64)
    return ItemGrid(benchmark, models, configs, items, num / den[:, :, None], num, den)


@dataclass
class CommonArrays:
    """Item scores of some models on one denominator per config: ``x[m, c, i]`` (integer
    valued floats when exact, in units of 1/``scale[c]``; the floats themselves otherwise)."""

    x: np.ndarray
    scale: np.ndarray | None      # (configs,) int64 common denominators; None: float scores
    n_items: int

    @property
    def exact(self) -> bool:
        return self.scale is not None

    def scores(self, sums: np.ndarray) -> Scores:
        """Cell scores from item sums ``sums[..., c]`` in these units."""
        if self.exact:
            num = np.rint(sums).astype(np.int64)
            return Scores(num=num, den=np.broadcast_to(self.scale * self.n_items, num.shape))
        return Scores(sums / self.n_items)


def common_arrays(g: "ItemGrid", models: list[int] | None = None) -> CommonArrays:
    idx = list(range(len(g.models))) if models is None else list(models)
    if not g.exact:
        return CommonArrays(g.value[idx], None, g.n_items)
    den = g.den[idx]                                            # (m, c)
    scale = np.array([lcm(*map(int, den[:, c])) for c in range(den.shape[1])], dtype=np.int64)
    x = g.num[idx] * (scale[None, :] // den)[:, :, None]
    if np.abs(x).max(initial=0) * max(g.n_items, 1) >= 2 ** 52:
        raise ValueError(f"benchmark {g.benchmark!r}: item counts too large for exact resampled sums")
    return CommonArrays(x.astype(float), scale, g.n_items)


def grids_for(cells: pd.DataFrame, results: pd.DataFrame, where: str = "item_results",
              skipped: dict | None = None) -> list:
    """Item grids of every benchmark, restricted to the cell table's configs and checked
    against its exact scores. With ``skipped`` (a dict), a benchmark whose item results do not
    reproduce its cell scores (a cell score that is no item mean) is recorded there instead of
    refused."""
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
                        if skipped is not None:
                            skipped[b] = "item results do not reproduce the cell scores (cell score is not an item mean)"
                            break
                        raise DataError(where, f"({m}, {b}, {c}): item results give {sc.num[i, j]}/{sc.den[i, j]}, "
                                               f"the cell scores {r['score_num']}/{r['score_den']}: the two tables "
                                               "come from different aggregations")
                else:
                    continue
                break
        if b not in (skipped or {}):
            grids.append(g)
    return grids
