"""Item-level verdicts read against noise: which reversals the items support, and how many
flips two exchangeable models would show anyway. Definitions: docs/VERDICTS.md section 2.

Per (benchmark, pair A < B, config), the statistic is the sign-flip studentised difference
S_c = sum_i d_ci / sqrt(sum_i d_ci^2), whose denominator the resampling does not change. One
resampling per family (:mod:`.resampling`; ``pair``: sign flips, ``benchmark``/``table``: model
permutations) gives the per-config p-values, their correction (step-down max-T by default,
Holm on request), the crossover decision and the noise references (``*_null_*``), so these
cannot contradict each other. Also: ``mdd`` (the difference detectable with 80% power) and
``bootstrap_items`` (the spread of the plug-in rho_flip over item redraws; no confidence
interval, as item noise biases rho_flip up).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from statistics import NormalDist

from .compare import Scores, diff_sign, rule_for
from .itemgrid import (MAX_ITEM_DEN, CommonArrays, ItemGrid, common_arrays, item_grid_from_results,  # noqa: F401
                       item_grid_from_scores)
from .resampling import Draws, auto_samples, model_permutations, sign_flips, stream

FAMILIES = {
    "pair": "the configs of one (benchmark, pair)",
    "benchmark": "every pair and config of a benchmark",
    "table": "every benchmark, pair and config of the table",
}
CORRECTIONS = {
    "maxt": "step-down max-T (Westfall-Young) on the joint item resampling",
    "holm": "Holm over the family's per-config resampling p-values",
}
POWER = 0.8
STAT_EPS = 1e-9              # |S*| within this (relative) of |S| counts as at least as extreme

PAIR_COLUMNS = ["benchmark", "model_a", "model_b", "n_configs", "n_items", "n_plus", "n_minus", "n_zero",
                "rho_flip", "rho_flip_null_mean", "rho_flip_null_q95", "rho_flip_null_p", "flips_exceed_noise",
                "n_plus_sig", "n_minus_sig", "rho_flip_sig", "alpha", "family", "correction", "crossover_p",
                "crossover", "p_a_ahead", "p_b_ahead", "crit", "mdd_median", "pattern", "resampling", "samples",
                "min_attainable_p", "can_reach_alpha", "tie_rule", "seed"]
CONFIG_COLUMNS = ["benchmark", "model_a", "model_b", "config", "n_items", "diff", "se", "stat", "test",
                  "p_value", "p_adj", "significant", "ahead", "mdd", "detectable"]
BENCH_COLUMNS = ["benchmark", "n_models", "n_configs", "n_items", "max_rho_flip", "max_pair",
                 "max_rho_flip_null_mean", "max_rho_flip_null_q95", "max_rho_flip_null_p",
                 "orderings_reachable", "orderings_possible", "orderings_null_mean", "orderings_null_q95",
                 "orderings_null_p", "order_change_rate", "order_change_null_mean", "order_change_null_q95",
                 "order_change_null_p", "order_change_exchangeable", "pairs_crossover", "pairs_sig_reversal",
                 "mdd_median", "verdict", "verdict_text", "alpha", "family", "correction", "samples", "seed"]
BOOT_COLUMNS = ["benchmark", "statistic", "model_a", "model_b", "resamples", "n_configs", "n_items",
                "estimate", "ci_low", "ci_high", "boot_mean", "samples", "seed", "reading"]
BOOT_READING = ("spread of the plug-in rho_flip under item resampling; not a confidence interval "
                "(item noise biases rho_flip up; see rho_flip_null_*)")
PATTERNS = {
    "stable": "no strict reversal (rho_flip = 0)",
    "noise": "reversals, none significant in either direction",
    "one_sided": "reversals, significant in one direction only",
    "crossover": "significant reversals both ways",
}
VERDICTS = {
    "stable": "no reversal on any config",
    "crossover": "reversals beyond item noise (a pair is significantly ahead on some configs and behind on others)",
    "excess_flips": "more flips than two exchangeable models give, but no pair reverses significantly both ways",
    "noise": "flips within item noise (exchangeable models flip as often)",
}


def holm(p: np.ndarray) -> np.ndarray:
    """Holm step-down adjusted p-values (one family: the whole vector)."""
    p = np.asarray(p, dtype=float)
    m = p.size
    if m == 0:
        return p
    order = np.argsort(p, kind="stable")
    adj = np.maximum.accumulate(np.minimum(1.0, (m - np.arange(m)) * p[order]))
    out = np.empty(m)
    out[order] = adj
    return out


def mcnemar_exact(n10: np.ndarray, n01: np.ndarray) -> np.ndarray:
    """Two-sided exact McNemar (sign test on discordant pairs) p-values."""
    from scipy.stats import binom  # deferred: scipy.stats, only the exact McNemar test needs it

    n10, n01 = np.asarray(n10), np.asarray(n01)
    n = n10 + n01
    p = np.minimum(1.0, 2.0 * binom.cdf(np.minimum(n10, n01), n, 0.5))
    return np.where(n == 0, 1.0, p)


def _at_least(star: np.ndarray, obs: np.ndarray) -> np.ndarray:
    return (star >= obs - STAT_EPS * np.maximum(1.0, np.abs(obs))).sum(axis=0)


def stepdown_maxt(abs_obs: np.ndarray, abs_star: np.ndarray, draws: Draws) -> np.ndarray:
    """Westfall-Young step-down max-T adjusted p-values of |S| over the columns of a family."""
    h = abs_obs.size
    if h == 0:
        return np.zeros(0)
    order = np.argsort(-abs_obs, kind="stable")
    succ = np.maximum.accumulate(abs_star[:, order][:, ::-1], axis=1)[:, ::-1]   # max over the rest
    q = draws.p_value(_at_least(succ, abs_obs[order]))
    out = np.empty(h)
    out[order] = np.minimum(1.0, np.maximum.accumulate(q))
    return out


@dataclass
class Family:
    """One multiplicity family: |S| observed and resampled for its hypotheses."""

    abs_obs: np.ndarray            # (H,)
    abs_star: np.ndarray           # (draws, H)
    draws: Draws
    correction: str

    def adjusted(self) -> tuple[np.ndarray, np.ndarray]:
        raw = self.draws.p_value(_at_least(self.abs_star, self.abs_obs))
        raw = np.where(self.abs_obs > 0, raw, 1.0)
        adj = holm(raw) if self.correction == "holm" else stepdown_maxt(self.abs_obs, self.abs_star, self.draws)
        return raw, np.where(self.abs_obs > 0, adj, 1.0)

    @property
    def min_attainable(self) -> float:
        h = self.abs_obs.size
        return min(1.0, self.draws.min_p * (h if self.correction == "holm" else 1))

    def crit(self, alpha: float) -> float:
        """The |S| a hypothesis must reach at the first step (max-T) or at alpha/H (Holm)."""
        if self.abs_obs.size == 0:
            return float("nan")
        if self.correction == "holm":
            return float(np.quantile(self.abs_star, 1 - alpha / self.abs_obs.size))
        return float(np.quantile(self.abs_star.max(axis=1), 1 - alpha))


@dataclass
class PairNull:
    """One (benchmark, pair): differences, sign-flip draws and what they give."""

    benchmark: str
    a: str
    b: str
    arrays: CommonArrays           # the two models on one denominator per config
    sign: np.ndarray               # observed sign per config (the tie rule)
    q: np.ndarray                  # sqrt(sum_i d_ci^2) per config, in the arrays' units
    draws: Draws
    abs_obs: np.ndarray
    abs_star: np.ndarray
    null_rho: np.ndarray           # rho_flip on each draw

    @property
    def d(self) -> np.ndarray:
        return self.arrays.x[0] - self.arrays.x[1]


def _resampled_signs(arr: CommonArrays, psum: np.ndarray, tstar: np.ndarray, tol) -> np.ndarray:
    """Signs of A - B when A's item sums are (P + T*)/2 and B's (P - T*)/2."""
    return diff_sign(arr.scores((psum + tstar) / 2), arr.scores((psum - tstar) / 2), tol)


def _rho(signs: np.ndarray) -> np.ndarray:
    return np.minimum((signs > 0).sum(axis=-1), (signs < 0).sum(axis=-1)) / signs.shape[-1]


def pair_null(g: ItemGrid, ia: int, ib: int, samples: int, seed: int, tol=None,
              sign: np.ndarray | None = None) -> PairNull:
    """Sign-flip draws of one pair and every statistic on them (S, per-config p, rho_flip
    noise reference)."""
    a, b = g.models[ia], g.models[ib]
    arr = common_arrays(g, [ia, ib])
    d = arr.x[0] - arr.x[1]                                    # (configs, items)
    psum = arr.x.sum(axis=(0, 2))
    if sign is None:
        sign = _resampled_signs(arr, psum, d.sum(axis=1), tol)
    active = np.flatnonzero(np.any(d != 0, axis=0))
    draws = sign_flips(active.size, samples, stream(seed, "signflip", g.benchmark, a, b))
    tstar = draws.values @ d[:, active].T                       # (draws, configs)
    q = np.sqrt((d ** 2).sum(axis=1))
    qs = np.where(q > 0, q, 1.0)
    abs_obs = np.where((sign != 0) & (q > 0), np.abs(d.sum(axis=1)) / qs, 0.0)
    abs_star = np.where(q > 0, np.abs(tstar) / qs, 0.0)
    null_rho = _rho(_resampled_signs(arr, psum, tstar, tol))
    return PairNull(g.benchmark, a, b, arr, np.asarray(sign), q, draws, abs_obs, abs_star, null_rho)


@dataclass
class BenchNull:
    """One benchmark's model-permutation draws: the benchmark-level noise references and the
    resampled |S| of every (pair, config) for the benchmark and table families."""

    benchmark: str
    pairs: list[tuple[int, int]]
    draws: Draws
    q_pool: np.ndarray             # (configs,) permutation-invariant spread
    abs_obs: np.ndarray            # (pairs * configs,)
    abs_star: np.ndarray           # (draws, pairs * configs)
    observed: dict
    null: dict = field(default_factory=dict)   # statistic -> (draws,) values


def _orders(signs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(reachable strict orders, order change rate) per leading index of signs[..., config, pair]:
    each config's sign vector is one code; sorted codes give the distinct orders and their sizes."""
    n_pairs = signs.shape[-1]
    codes = ((signs.astype(np.int64) + 1) * (3 ** np.arange(n_pairs, dtype=np.int64))).sum(axis=-1)
    strict = np.all(signs != 0, axis=-1)
    lead = codes.reshape(-1, codes.shape[-1])
    rows, n_cfg = lead.shape
    if n_cfg == 0:
        nan = np.full(codes.shape[:-1], np.nan)
        return np.zeros(codes.shape[:-1]), nan
    srt = np.sort(lead, axis=1)
    new = np.ones((rows, n_cfg), dtype=bool)
    new[:, 1:] = srt[:, 1:] != srt[:, :-1]
    gid = np.cumsum(new, axis=1) - 1 + (np.arange(rows) * n_cfg)[:, None]
    k = np.bincount(gid.ravel(), minlength=rows * n_cfg).reshape(rows, n_cfg).astype(float)
    pairs_total = n_cfg * (n_cfg - 1) / 2
    change = (pairs_total - (k * (k - 1) / 2).sum(axis=1)) / pairs_total if pairs_total else np.full(rows, np.nan)
    strict_codes = np.where(strict.reshape(rows, n_cfg), lead, -1)
    ss = np.sort(strict_codes, axis=1)
    first = np.ones((rows, n_cfg), dtype=bool)
    first[:, 1:] = ss[:, 1:] != ss[:, :-1]
    reach = (first & (ss >= 0)).sum(axis=1).astype(float)
    return reach.reshape(codes.shape[:-1]), change.reshape(codes.shape[:-1])


def _bench_stats(arr: CommonArrays, sums: np.ndarray, pairs, tol) -> tuple[np.ndarray, dict]:
    """Per draw (sums: draws x models x configs): pair signs (draws, configs, pairs) and the
    max rho_flip, orderings reachable and order change rate."""
    sc = arr.scores(sums)
    i = [p[0] for p in pairs]
    j = [p[1] for p in pairs]
    signs = diff_sign(sc[:, i, :], sc[:, j, :], tol).transpose(0, 2, 1)   # (draws, configs, pairs)
    rho = _rho(signs.transpose(0, 2, 1))                                     # (draws, pairs)
    reach, change = _orders(signs)
    return signs, {"max_rho_flip": rho.max(axis=1), "orderings_reachable": reach, "order_change_rate": change}


def bench_null(g: ItemGrid, samples: int, seed: int, tol=None, chunk: int = 256) -> BenchNull:
    arr = common_arrays(g)
    m, nc, n = arr.x.shape
    pairs = list(itertools.combinations(range(m), 2))
    draws = model_permutations(n, m, samples, stream(seed, "permute", g.benchmark))
    xd = arr.x[:, None, :, :] - arr.x[None, :, :, :]
    q_pool = np.sqrt(sum((xd[p] ** 2).sum(axis=-1) for p in pairs)) if pairs else np.zeros(nc)
    qs = np.where(q_pool > 0, q_pool, 1.0)
    obs_sums = arr.x.sum(axis=2)[None]
    obs_signs, observed = _bench_stats(arr, obs_sums, pairs, tol)
    observed = {k: float(v[0]) for k, v in observed.items()}
    t_obs = np.stack([obs_sums[0, i] - obs_sums[0, j] for i, j in pairs]) if pairs else np.zeros((0, nc))
    sign_obs = obs_signs[0].T                                  # (pairs, configs)
    abs_obs = np.where((sign_obs != 0) & (q_pool > 0), np.abs(t_obs) / qs, 0.0).reshape(-1)
    null = {k: [] for k in observed}
    stars = []
    for s0 in range(0, samples, chunk):
        perm = draws.values[s0:s0 + chunk]                     # (ch, items, models)
        ch = perm.shape[0]
        sums = np.zeros((ch, m, nc))
        for k in range(m):
            w = (perm == k).transpose(0, 2, 1).reshape(ch * m, n).astype(float)
            sums += (w @ arr.x[k].T).reshape(ch, m, nc)
        _, st = _bench_stats(arr, sums, pairs, tol)
        for key, v in st.items():
            null[key].append(v)
        t = np.stack([sums[:, i] - sums[:, j] for i, j in pairs], axis=1) if pairs else np.zeros((ch, 0, nc))
        stars.append(np.where(q_pool > 0, np.abs(t) / qs, 0.0).reshape(ch, -1))
    return BenchNull(g.benchmark, pairs, draws, q_pool, abs_obs, np.concatenate(stars, axis=0), observed,
                     {k: np.concatenate(v) for k, v in null.items()})


def null_summary(null: np.ndarray, observed: float, draws: Draws) -> dict:
    """Mean, 95th percentile and P(null >= observed) of a noise reference."""
    return {"null_mean": float(np.mean(null)), "null_q95": float(np.quantile(null, 0.95)),
            "null_p": float(draws.p_value(np.sum(null >= observed - 1e-12)))}


def _percentile(dist: np.ndarray) -> tuple[float, float]:
    lo, hi = np.percentile(dist, [2.5, 97.5])
    return float(lo), float(hi)


def _pattern(n_plus: int, n_minus: int, n_plus_sig: int, n_minus_sig: int) -> str:
    if min(n_plus, n_minus) == 0:
        return "stable"
    if n_plus_sig and n_minus_sig:
        return "crossover"
    if n_plus_sig or n_minus_sig:
        return "one_sided"
    return "noise"


def _mdd(crit: float, q_stat: np.ndarray, q_pair: np.ndarray, scale, n: int, attainable: bool) -> np.ndarray:
    """Smallest |diff| detected with POWER: reject when |T| >= crit * q_stat, T ~ N(n delta, q_pair^2)."""
    if not attainable or not np.isfinite(crit):
        return np.full(q_stat.shape, np.inf)
    worst = math.sqrt(n) * (1.0 if scale is None else scale)      # |d| <= 1 score unit on every item
    pooled = np.sqrt(np.mean(q_pair ** 2)) if q_pair.size else 0.0
    fill = np.where(pooled > 0, pooled, worst)
    qp = np.where(q_pair > 0, q_pair, fill)
    qs = np.where(q_stat > 0, q_stat, qp)
    unit = n * (1.0 if scale is None else np.asarray(scale, dtype=float))
    return (crit * qs + NormalDist().inv_cdf(POWER) * qp) / unit


@dataclass
class Settings:
    alpha: float = 0.05
    samples: int | None = None     # None: auto (resampling.auto_samples)
    seed: int = 0
    tol: float | None = None
    family: str = "pair"
    correction: str = "maxt"

    def check(self) -> None:
        if not (0 < self.alpha < 1):
            raise ValueError(f"alpha must be in (0, 1) (got {self.alpha})")
        if self.samples is not None and int(self.samples) < 1:
            raise ValueError(f"resampling samples must be >= 1 (got {self.samples})")
        if int(self.seed) < 0:
            raise ValueError(f"the resampling seed must be >= 0 (got {self.seed})")
        if self.family not in FAMILIES:
            raise ValueError(f"family must be one of {sorted(FAMILIES)} (got {self.family!r})")
        if self.correction not in CORRECTIONS:
            raise ValueError(f"correction must be one of {sorted(CORRECTIONS)} (got {self.correction!r})")


def family_size(grids: list[ItemGrid], family: str) -> int:
    sizes = [len(g.configs) * len(g.models) * (len(g.models) - 1) // 2 for g in grids]
    if family == "pair":
        return max((len(g.configs) for g in grids), default=1)
    return max(sizes, default=1) if family == "benchmark" else max(sum(sizes), 1)


def resolved_samples(grids: list[ItemGrid], s: Settings) -> int:
    return int(s.samples) if s.samples is not None else auto_samples(s.alpha, family_size(grids, s.family),
                                                                     s.correction)


def significance_tables(grids: list[ItemGrid], settings: Settings | None = None, *, table: str = "significance",
                        warnings: list[str] | None = None) -> dict[str, pd.DataFrame]:
    """``significance`` (per benchmark and pair), ``significance_configs`` (per config),
    ``significance_benchmarks`` (per benchmark: the noise references and the verdict) and
    ``bootstrap_items``. Resolution problems are appended to ``warnings`` (naming ``table``)."""
    s = settings or Settings()
    s.check()
    grids = sorted(grids, key=lambda x: x.benchmark)
    B = resolved_samples(grids, s)
    warnings = warnings if warnings is not None else []
    pnulls: dict[str, list[PairNull]] = {}
    bnulls: dict[str, BenchNull] = {}
    cells_of = {}
    for g in grids:
        cells = cells_of[g.benchmark] = g.cell_scores()
        pnulls[g.benchmark] = [pair_null(g, ia, ib, B, s.seed, s.tol, diff_sign(cells[ia], cells[ib], s.tol))
                               for ia, ib in itertools.combinations(range(len(g.models)), 2)]
        bnulls[g.benchmark] = bench_null(g, B, s.seed, s.tol)
    # families -> adjusted p per (benchmark, pair index) as (configs,) arrays
    fams: list[tuple[Family, list[tuple[str, int]]]] = []
    if s.family == "pair":
        for b, pl in pnulls.items():
            for k, pn in enumerate(pl):
                fams.append((Family(pn.abs_obs, pn.abs_star, pn.draws, s.correction), [(b, k)]))
    elif s.family == "benchmark":
        for b, bn in bnulls.items():
            fams.append((Family(bn.abs_obs, bn.abs_star, bn.draws, s.correction),
                         [(b, k) for k in range(len(bn.pairs))]))
    else:
        bl = [bn for bn in bnulls.values() if bn.pairs]
        if bl:
            fams.append((Family(np.concatenate([x.abs_obs for x in bl]), np.concatenate([x.abs_star for x in bl], axis=1),
                                bl[0].draws, s.correction), [(x.benchmark, k) for x in bl for k in range(len(x.pairs))]))
    decided: dict[tuple[str, int], dict] = {}
    for fam, members in fams:
        raw, adj = fam.adjusted()
        crit = fam.crit(s.alpha)
        minp = fam.min_attainable
        reach = minp <= s.alpha
        if not reach:
            where = ("; ".join(f"{b} {pnulls[b][k].a} vs {pnulls[b][k].b}" for b, k in members[:3])
                     + (f" and {len(members) - 3} more" if len(members) > 3 else ""))
            hint = ("too few items differ for any test to reach it" if fam.draws.kind == "exact"
                    else f"raise the resampling samples to at least {auto_samples(s.alpha, fam.abs_obs.size, s.correction)}")
            warnings.append(f"{table}: {where}: with {fam.draws.describe()} the smallest attainable p after "
                            f"{s.correction} over {fam.abs_obs.size} tests is {minp:.3g} > alpha = {s.alpha:g}: "
                            f"no reversal can be significant ({hint})")
        off = 0
        for b, k in members:
            pn = pnulls[b][k]
            nc = pn.sign.size
            sl = slice(off, off + nc)
            off += nc
            q_stat = pn.q if s.family == "pair" else bnulls[b].q_pool
            decided[(b, k)] = {"raw": raw[sl], "adj": adj[sl], "crit": crit, "min_p": minp, "reach": reach,
                               "resampling": fam.draws.describe(),
                               "mdd": _mdd(crit, q_stat, pn.q, pn.arrays.scale, pn.arrays.n_items, reach)}
    pair_rows, cfg_rows, bench_rows, boot_rows = [], [], [], []
    for g in grids:
        b = g.benchmark
        n, nc = g.n_items, len(g.configs)
        rule = rule_for([cells_of[b]], s.tol).kind
        binary = np.all((g.value == 0) | (g.value == 1), axis=2)
        n_cross, n_rev_sig, mdds = 0, 0, []
        for k, pn in enumerate(pnulls[b]):
            dec = decided[(b, k)]
            sign = pn.sign
            sig = dec["adj"] <= s.alpha
            plus, minus = sig & (sign > 0), sig & (sign < 0)
            n_plus, n_minus = int(np.sum(sign > 0)), int(np.sum(sign < 0))
            rho = float(_rho(sign))
            p_a = float(dec["adj"][sign > 0].min()) if n_plus else 1.0
            p_b = float(dec["adj"][sign < 0].min()) if n_minus else 1.0
            nul = null_summary(pn.null_rho, rho, pn.draws)
            pattern = _pattern(n_plus, n_minus, int(plus.sum()), int(minus.sum()))
            n_cross += pattern == "crossover"
            n_rev_sig += pattern in ("crossover", "one_sided")
            mdds.append(dec["mdd"])
            ia, ib = g.models.index(pn.a), g.models.index(pn.b)
            dv = g.value[ia] - g.value[ib]
            diff = dv.mean(axis=1)
            se = dv.std(axis=1, ddof=1) / np.sqrt(n) if n > 1 else np.full(nc, np.nan)
            pair_rows.append({
                "benchmark": b, "model_a": pn.a, "model_b": pn.b, "n_configs": nc, "n_items": n,
                "n_plus": n_plus, "n_minus": n_minus, "n_zero": nc - n_plus - n_minus, "rho_flip": rho,
                "rho_flip_null_mean": nul["null_mean"], "rho_flip_null_q95": nul["null_q95"],
                "rho_flip_null_p": nul["null_p"], "flips_exceed_noise": bool(rho > 0 and nul["null_p"] <= s.alpha),
                "n_plus_sig": int(plus.sum()), "n_minus_sig": int(minus.sum()),
                "rho_flip_sig": min(int(plus.sum()), int(minus.sum())) / nc, "alpha": float(s.alpha),
                "family": s.family, "correction": CORRECTIONS[s.correction],
                "crossover_p": max(p_a, p_b), "crossover": bool(max(p_a, p_b) <= s.alpha),
                "p_a_ahead": p_a, "p_b_ahead": p_b, "crit": dec["crit"],
                "mdd_median": float(np.median(dec["mdd"])), "pattern": pattern, "resampling": dec["resampling"],
                "samples": int(pn.draws.samples), "min_attainable_p": dec["min_p"], "can_reach_alpha": dec["reach"],
                "tie_rule": rule, "seed": int(s.seed)})
            both01 = binary[ia] & binary[ib]
            stat = np.where(pn.q > 0, pn.d.sum(axis=1) / np.where(pn.q > 0, pn.q, 1.0), 0.0)
            for j, c in enumerate(g.configs):
                test = ("none (tie)" if sign[j] == 0 else
                        ("sign_flip_exact" if pn.draws.kind == "exact" else "sign_flip")
                        + (" (exact McNemar for 0/1 items)" if both01[j] and pn.draws.kind == "exact" else ""))
                cfg_rows.append({"benchmark": b, "model_a": pn.a, "model_b": pn.b, "config": c, "n_items": n,
                                 "diff": float(diff[j]), "se": float(se[j]), "stat": float(stat[j]), "test": test,
                                 "p_value": float(dec["raw"][j]), "p_adj": float(dec["adj"][j]),
                                 "significant": bool(sig[j]),
                                 "ahead": pn.a if plus[j] else (pn.b if minus[j] else ""),
                                 "mdd": float(dec["mdd"][j]), "detectable": bool(np.isfinite(dec["mdd"][j]))})
        bn = bnulls[b]
        ob = bn.observed
        best = max(pair_rows[-len(pnulls[b]):], key=lambda r: r["rho_flip"]) if pnulls[b] else None
        nul = {k: null_summary(bn.null[k], ob[k], bn.draws) for k in ob}
        exceed = ob["max_rho_flip"] > 0 and nul["max_rho_flip"]["null_p"] <= s.alpha
        verdict = ("stable" if not ob["max_rho_flip"] else "crossover" if n_cross else
                   "excess_flips" if exceed else "noise")
        mdd_all = np.concatenate(mdds) if mdds else np.array([np.inf])
        bench_rows.append({
            "benchmark": b, "n_models": len(g.models), "n_configs": nc, "n_items": n,
            "max_rho_flip": ob["max_rho_flip"], "max_pair": f"{best['model_a']} vs {best['model_b']}" if best else "",
            "max_rho_flip_null_mean": nul["max_rho_flip"]["null_mean"],
            "max_rho_flip_null_q95": nul["max_rho_flip"]["null_q95"],
            "max_rho_flip_null_p": nul["max_rho_flip"]["null_p"],
            "orderings_reachable": int(ob["orderings_reachable"]), "orderings_possible": math.factorial(len(g.models)),
            "orderings_null_mean": nul["orderings_reachable"]["null_mean"],
            "orderings_null_q95": nul["orderings_reachable"]["null_q95"],
            "orderings_null_p": nul["orderings_reachable"]["null_p"],
            "order_change_rate": ob["order_change_rate"],
            "order_change_null_mean": nul["order_change_rate"]["null_mean"],
            "order_change_null_q95": nul["order_change_rate"]["null_q95"],
            "order_change_null_p": nul["order_change_rate"]["null_p"],
            "order_change_exchangeable": 1.0 - 1.0 / math.factorial(len(g.models)),
            "pairs_crossover": int(n_cross), "pairs_sig_reversal": int(n_rev_sig),
            "mdd_median": float(np.median(mdd_all)), "verdict": verdict, "verdict_text": VERDICTS[verdict],
            "alpha": float(s.alpha), "family": s.family, "correction": CORRECTIONS[s.correction],
            "samples": int(bn.draws.samples), "seed": int(s.seed)})
        boot_rows += _item_bootstrap(g, pnulls[b], B, s)
    return {"significance": pd.DataFrame(pair_rows, columns=PAIR_COLUMNS),
            "significance_configs": pd.DataFrame(cfg_rows, columns=CONFIG_COLUMNS),
            "significance_benchmarks": pd.DataFrame(bench_rows, columns=BENCH_COLUMNS),
            "bootstrap_items": pd.DataFrame(boot_rows, columns=BOOT_COLUMNS)}


def draw_weights(n_items: int, samples: int, seed: int, benchmark: str) -> np.ndarray:
    """(samples, n_items) multiplicities of a with-replacement draw of n_items items."""
    if samples < 1:
        raise ValueError("bootstrap samples must be >= 1")
    return stream(seed, "items:" + benchmark).multinomial(n_items, np.full(n_items, 1.0 / n_items),
                                                          size=samples).astype(float)


def _item_bootstrap(g: ItemGrid, pairs: list[PairNull], samples: int, s: Settings) -> list[dict]:
    """Spread of the plug-in rho_flip (per pair and its max) over item redraws."""
    if not pairs:
        return []
    W = draw_weights(g.n_items, samples, s.seed, g.benchmark)
    boot = g.cell_scores(W)
    nc = len(g.configs)
    rows, dists, points = [], [], []
    for pn in pairs:
        a, b = pn.a, pn.b
        ia, ib = g.models.index(a), g.models.index(b)
        dist = _rho(diff_sign(boot[:, ia, :], boot[:, ib, :], s.tol))
        point = float(_rho(pn.sign))
        dists.append(dist)
        points.append(point)
        lo, hi = _percentile(dist)
        rows.append({"benchmark": g.benchmark, "statistic": f"{a} vs {b}", "model_a": a, "model_b": b,
                     "resamples": "items", "n_configs": nc, "n_items": g.n_items, "estimate": point,
                     "ci_low": lo, "ci_high": hi, "boot_mean": float(dist.mean()), "samples": int(samples),
                     "seed": int(s.seed), "reading": BOOT_READING})
    mx = np.max(np.stack(dists, axis=1), axis=1)
    lo, hi = _percentile(mx)
    rows.append({"benchmark": g.benchmark, "statistic": "max", "model_a": "", "model_b": "", "resamples": "items",
                 "n_configs": nc, "n_items": g.n_items, "estimate": max(points), "ci_low": lo, "ci_high": hi,
                 "boot_mean": float(mx.mean()), "samples": int(samples), "seed": int(s.seed), "reading": BOOT_READING})
    return rows


def noise_columns(grids: list[ItemGrid], samples: int, seed: int, tol=None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The noise references alone (no tests), for tables over config subsets: per (benchmark,
    pair) ``rho_flip_null_*`` and per benchmark ``max_rho_flip_null_*``, ``orderings_null_*``,
    ``order_change_null_*`` (same streams as :func:`significance_tables`)."""
    prow, brow = [], []
    for g in sorted(grids, key=lambda x: x.benchmark):
        if len(g.configs) == 0:
            continue
        cells = g.cell_scores()
        for ia, ib in itertools.combinations(range(len(g.models)), 2):
            sg = diff_sign(cells[ia], cells[ib], tol)
            pn = pair_null(g, ia, ib, samples, seed, tol, sg)
            nul = null_summary(pn.null_rho, float(_rho(sg)), pn.draws)
            prow.append({"benchmark": g.benchmark, "model_a": pn.a, "model_b": pn.b, "rho_flip_null_mean": nul["null_mean"],
                         "rho_flip_null_q95": nul["null_q95"], "rho_flip_null_p": nul["null_p"]})
        bn = bench_null(g, samples, seed, tol)
        r = {"benchmark": g.benchmark}
        for k, name in (("max_rho_flip", "max_rho_flip"), ("orderings_reachable", "orderings"),
                        ("order_change_rate", "order_change")):
            nul = null_summary(bn.null[k], bn.observed[k], bn.draws)
            r |= {f"{name}_null_mean": nul["null_mean"], f"{name}_null_q95": nul["null_q95"],
                  f"{name}_null_p": nul["null_p"]}
        brow.append(r)
    return pd.DataFrame(prow), pd.DataFrame(brow)


def headline_sentence(row: dict) -> str:
    """One benchmark's verdict read against noise (a ``significance_benchmarks`` row), in words."""
    mdd = row.get("mdd_median", float("nan"))
    power = (f"; with {row['n_items']} items a config needs a difference of about {100 * mdd:.0f} pp to be "
             "detected (80% power)" if np.isfinite(mdd) else
             f"; with {row['n_items']} items no reversal of any size can be significant")
    return (f"{row['benchmark']}: max rho_flip {row['max_rho_flip']:.3f} ({row['max_pair']}); two exchangeable "
            f"models give {row['max_rho_flip_null_mean']:.3f} on average (95%: {row['max_rho_flip_null_q95']:.3f}), "
            f"p = {row['max_rho_flip_null_p']:.3g}; {row['pairs_crossover']} pair(s) reverse significantly both "
            f"ways -> {row['verdict_text']}{power}")


def analyse_grid(g: ItemGrid, **settings) -> dict[str, pd.DataFrame]:
    """:func:`significance_tables` of one benchmark (keyword arguments: :class:`Settings`)."""
    return significance_tables([g], Settings(**settings))
