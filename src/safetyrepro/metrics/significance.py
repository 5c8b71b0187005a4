"""Item-level uncertainty of the verdicts: which reversals are more than item noise.

Every benchmark scores one fixed item subset, so two models' scores on a config are paired on
the same items. Per benchmark, model pair (A, B) (A < B by name) and config c, with x_Ai the
item score of A (0/1 for a greedy or logprob cell; for a sampled cell the item's mean over its
seeds, k/5) and d_i = x_Ai - x_Bi over the n items:

* ``diff`` = mean_i d_i (= score_A(c) - score_B(c)); ``se`` = sd(d_i, ddof=1) / sqrt(n).
  Its sign is :mod:`.compare`'s (exact fractions of counts), so an exact tie has diff 0, p 1.
* a two-sided paired test of "no difference on these items":
  - ``mcnemar_exact`` when every item score of both cells is 0 or 1: with n10 items only A
    gets right and n01 only B, p = min(1, 2 P[X <= min(n10, n01)]), X ~ Bin(n10 + n01, 1/2)
    (the exact sign test on the discordant items; p = 1 when there are none);
  - ``paired_bootstrap`` otherwise: items resampled with replacement (the same draws for every
    config and model, see below), p = (1 + #{|diff* - diff| >= |diff|}) / (B + 1), the
    share of centred bootstrap means at least as far from the observed one as it is from 0.
* Holm's step-down correction over the configs of the pair on that benchmark (the family is
  the |C| two-sided tests): p_holm(k) = max_{j <= k} min(1, (m - j + 1) p_(j)). A config
  counts in N+_sig (A significantly ahead) when p_holm <= alpha and diff > 0, in N-_sig when
  p_holm <= alpha and diff < 0. rho_flip_sig = min(N+_sig, N-_sig) / |C| (ties, and
  differences that are not significant, stay in the denominator as for rho_flip).
* Crossover test (the range-test idea of Piantadosi & Gail, 1993: is there a config where A
  is significantly ahead AND one where B is?). Studentised differences z_c = diff_c / se_c;
  T_A = max_c z_c, T_B = max_c -z_c. Critical values come from the joint paired bootstrap
  over items (configs share the items, so their differences are correlated; no independence
  is assumed): with z*_c = (diff*_c - diff_c) / se_c, M_A = max_c z*_c and M_B = max_c -z*_c
  per draw, p_A = (1 + #{M_A >= T_A}) / (B + 1) tests "A is ahead nowhere" (all delta_c <= 0;
  the max-T bound holds at its least favourable point, every delta_c = 0) and p_B likewise.
  The crossover hypothesis is rejected only when both are (an intersection-union test), so
  its p-value is max(p_A, p_B) and ``crossover`` = p <= alpha; ``crit_a``/``crit_b`` are the
  (1 - alpha) quantiles of M_A/M_B, the thresholds T_A/T_B have to pass.
* An item-bootstrap interval for rho_flip (and its max over pairs): the same B draws of items,
  applied jointly to every config and model, recompute every cell score (exactly, as
  fractions of counts where the items are counts) and rho_flip; percentile 2.5/97.5. It
  resamples ITEMS (configs fixed); the analysis' other bootstrap resamples CONFIGURATIONS
  (items fixed). Both are labelled in the ``resamples`` column.

Assumptions: items are exchangeable draws from the benchmark's item population (they are a
fixed stratified subset; the bootstrap ignores the strata); seeds within an item are averaged
first, so seed noise is part of each item's score; configs are the fixed envelope.
The bootstrap draws come from a per-benchmark seeded stream (reproducible, independent of
which other benchmarks are present).
"""

from __future__ import annotations

import itertools
import zlib
from dataclasses import dataclass
from fractions import Fraction
from math import lcm

import numpy as np
import pandas as pd

from .compare import Scores, diff_sign, rule_for

MAX_ITEM_DEN = 1000          # item scores recovered as fractions k/q with q up to this
PAIR_COLUMNS = ["benchmark", "model_a", "model_b", "n_configs", "n_items", "n_plus", "n_minus", "n_zero",
                "rho_flip", "n_plus_sig", "n_minus_sig", "rho_flip_sig", "alpha", "correction",
                "crossover_p", "crossover", "p_a_ahead", "p_b_ahead", "crit_a", "crit_b", "pattern",
                "tie_rule", "samples", "seed"]
CONFIG_COLUMNS = ["benchmark", "model_a", "model_b", "config", "n_items", "diff", "se", "z", "test",
                  "p_value", "p_holm", "significant", "ahead"]
BOOT_COLUMNS = ["benchmark", "statistic", "model_a", "model_b", "resamples", "n_configs", "n_items",
                "estimate", "ci_low", "ci_high", "boot_mean", "samples", "seed"]
CORRECTION = "holm over the configs of each (benchmark, pair)"
PATTERNS = {
    "stable": "no strict reversal (rho_flip = 0)",
    "noise": "reversals, none significant in either direction",
    "one_sided": "reversals, significant in one direction only",
    "crossover": "significant reversals both ways",
}


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


def holm(p: np.ndarray) -> np.ndarray:
    """Holm step-down adjusted p-values (one family: the whole vector)."""
    p = np.asarray(p, dtype=float)
    m = p.size
    if m == 0:
        return p
    order = np.argsort(p, kind="stable")
    adj = np.minimum(1.0, (m - np.arange(m)) * p[order])
    adj = np.maximum.accumulate(adj)
    out = np.empty(m)
    out[order] = adj
    return out


def mcnemar_exact(n10: np.ndarray, n01: np.ndarray) -> np.ndarray:
    """Two-sided exact McNemar (sign test on discordant pairs) p-values."""
    from scipy.stats import binom

    n10, n01 = np.asarray(n10), np.asarray(n01)
    n = n10 + n01
    p = np.minimum(1.0, 2.0 * binom.cdf(np.minimum(n10, n01), n, 0.5))
    return np.where(n == 0, 1.0, p)


def benchmark_rng(seed: int, benchmark: str) -> np.random.Generator:
    """The item-bootstrap stream of one benchmark (independent of the other benchmarks)."""
    return np.random.default_rng(np.random.SeedSequence([int(seed), zlib.crc32(b"items:" + benchmark.encode())]))


def draw_weights(n_items: int, samples: int, seed: int, benchmark: str) -> np.ndarray:
    """(samples, n_items) multiplicities of a with-replacement draw of n_items items."""
    if samples < 1:
        raise ValueError("bootstrap samples must be >= 1")
    return benchmark_rng(seed, benchmark).multinomial(n_items, np.full(n_items, 1.0 / n_items),
                                                      size=samples).astype(float)


def _pattern(n_plus: int, n_minus: int, n_plus_sig: int, n_minus_sig: int) -> str:
    if min(n_plus, n_minus) == 0:
        return "stable"
    if n_plus_sig and n_minus_sig:
        return "crossover"
    if n_plus_sig or n_minus_sig:
        return "one_sided"
    return "noise"


def _percentile(dist: np.ndarray) -> tuple[float, float]:
    lo, hi = np.percentile(dist, [2.5, 97.5])
    return float(lo), float(hi)


def analyse_grid(g: ItemGrid, alpha: float = 0.05, samples: int = 1000, seed: int = 0,
                 tol: float | None = None) -> tuple[list[dict], list[dict], list[dict]]:
    """(pair rows, config rows, item-bootstrap rows) of one benchmark; see the module doc."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1) (got {alpha})")
    n, nc = g.n_items, len(g.configs)
    if n < 2:
        raise ValueError(f"benchmark {g.benchmark!r}: item-level significance needs at least 2 items")
    W = draw_weights(n, samples, seed, g.benchmark)
    cells = g.cell_scores()                               # (models, configs)
    boot_cells = g.cell_scores(W)                         # (draws, models, configs)
    binary = np.all((g.value == 0) | (g.value == 1), axis=2)   # (models, configs)
    rule = rule_for([cells], tol).kind
    pair_rows, cfg_rows, boot_rows = [], [], []
    boot_rho, point_rho = [], []
    for ia, ib in itertools.combinations(range(len(g.models)), 2):
        a, b = g.models[ia], g.models[ib]
        sign = diff_sign(cells[ia], cells[ib], tol)       # (configs,), the one definition
        d = g.value[ia] - g.value[ib]                     # (configs, items)
        diff = d.mean(axis=1)
        se = d.std(axis=1, ddof=1) / np.sqrt(n)
        with np.errstate(divide="ignore", invalid="ignore"):
            z = np.where(se > 0, diff / se, np.sign(sign) * np.inf)
        z = np.where(sign == 0, 0.0, z)                   # a tie (exact, or within tol) is no evidence
        # per-config tests
        both01 = binary[ia] & binary[ib]
        n10 = np.sum((g.value[ia] == 1) & (g.value[ib] == 0), axis=1)
        n01 = np.sum((g.value[ia] == 0) & (g.value[ib] == 1), axis=1)
        p_mc = mcnemar_exact(n10, n01)
        dstar = W @ d.T / n                                # (draws, configs)
        far = np.abs(dstar - diff) >= np.abs(diff) - 1e-12 * np.maximum(1.0, np.abs(diff))
        p_bs = (1.0 + far.sum(axis=0)) / (samples + 1.0)
        p = np.where(both01, p_mc, p_bs)
        p = np.where(sign == 0, 1.0, p)
        p_h = holm(p)
        sig = p_h <= alpha
        ahead = np.where(sig & (sign > 0), a, np.where(sig & (sign < 0), b, ""))
        n_plus_sig, n_minus_sig = int(np.sum(sig & (sign > 0))), int(np.sum(sig & (sign < 0)))
        # crossover: joint max-T over configs
        with np.errstate(divide="ignore", invalid="ignore"):
            zstar = np.where(se > 0, (dstar - diff) / np.where(se > 0, se, 1.0), 0.0)
        m_a, m_b = zstar.max(axis=1), (-zstar).max(axis=1)
        t_a, t_b = float(np.max(z)), float(np.max(-z))
        p_a = float((1 + np.sum(m_a >= t_a)) / (samples + 1)) if t_a > 0 else 1.0
        p_b = float((1 + np.sum(m_b >= t_b)) / (samples + 1)) if t_b > 0 else 1.0
        cross_p = max(p_a, p_b)
        n_plus, n_minus = int(np.sum(sign > 0)), int(np.sum(sign < 0))
        rho = min(n_plus, n_minus) / nc
        # item bootstrap of rho_flip: every cell recomputed on the same item draws
        bsign = diff_sign(boot_cells[:, ia, :], boot_cells[:, ib, :], tol)
        brho = np.minimum((bsign > 0).sum(axis=1), (bsign < 0).sum(axis=1)) / nc
        boot_rho.append(brho)
        point_rho.append(rho)
        pair_rows.append({
            "benchmark": g.benchmark, "model_a": a, "model_b": b, "n_configs": nc, "n_items": n,
            "n_plus": n_plus, "n_minus": n_minus, "n_zero": nc - n_plus - n_minus, "rho_flip": rho,
            "n_plus_sig": n_plus_sig, "n_minus_sig": n_minus_sig,
            "rho_flip_sig": min(n_plus_sig, n_minus_sig) / nc, "alpha": float(alpha), "correction": CORRECTION,
            "crossover_p": cross_p, "crossover": bool(cross_p <= alpha), "p_a_ahead": p_a, "p_b_ahead": p_b,
            "crit_a": float(np.quantile(m_a, 1 - alpha)), "crit_b": float(np.quantile(m_b, 1 - alpha)),
            "pattern": _pattern(n_plus, n_minus, n_plus_sig, n_minus_sig), "tie_rule": rule,
            "samples": int(samples), "seed": int(seed)})
        for j, c in enumerate(g.configs):
            cfg_rows.append({"benchmark": g.benchmark, "model_a": a, "model_b": b, "config": c, "n_items": n,
                             "diff": float(diff[j]), "se": float(se[j]), "z": float(z[j]),
                             "test": "none (tie)" if sign[j] == 0 else
                             ("mcnemar_exact" if both01[j] else "paired_bootstrap"),
                             "p_value": float(p[j]), "p_holm": float(p_h[j]), "significant": bool(sig[j]),
                             "ahead": str(ahead[j])})
        lo, hi = _percentile(brho)
        boot_rows.append({"benchmark": g.benchmark, "statistic": f"{a} vs {b}", "model_a": a, "model_b": b,
                          "resamples": "items", "n_configs": nc, "n_items": n, "estimate": rho,
                          "ci_low": lo, "ci_high": hi, "boot_mean": float(brho.mean()),
                          "samples": int(samples), "seed": int(seed)})
    if boot_rho:
        mx = np.max(np.stack(boot_rho, axis=1), axis=1)
        lo, hi = _percentile(mx)
        boot_rows.append({"benchmark": g.benchmark, "statistic": "max", "model_a": "", "model_b": "",
                          "resamples": "items", "n_configs": nc, "n_items": n, "estimate": max(point_rho),
                          "ci_low": lo, "ci_high": hi, "boot_mean": float(mx.mean()),
                          "samples": int(samples), "seed": int(seed)})
    return pair_rows, cfg_rows, boot_rows


def significance_tables(grids: list[ItemGrid], alpha: float = 0.05, samples: int = 1000, seed: int = 0,
                        tol: float | None = None) -> dict[str, pd.DataFrame]:
    """``significance`` (per benchmark and pair), ``significance_configs`` (per config) and
    ``bootstrap_items`` (item-bootstrap intervals of rho_flip) for the given benchmarks."""
    pairs, cfgs, boots = [], [], []
    for g in sorted(grids, key=lambda x: x.benchmark):
        p, c, b = analyse_grid(g, alpha, samples, seed, tol)
        pairs += p
        cfgs += c
        boots += b
    return {"significance": pd.DataFrame(pairs, columns=PAIR_COLUMNS),
            "significance_configs": pd.DataFrame(cfgs, columns=CONFIG_COLUMNS),
            "bootstrap_items": pd.DataFrame(boots, columns=BOOT_COLUMNS)}
