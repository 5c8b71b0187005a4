"""Verdict-flip metrics for one benchmark over a configuration set C (docs/VERDICTS.md).

For a model pair (A, B): N+, N-, N0 count the configs where A is ahead, behind or tied;
rho_flip = min(N+, N-) / |C| (eq. 2; ties stay in the denominator), with Prop. 1's D1 (no
strict reversal), D2 (a single sign verdict) and ceiling floor(|C|/2)/|C|. Over all models:
the strict total orders the configs induce (:func:`orderings`) and tau_R, the mean Kendall
tau-b between the rankings of every pair of configs (pairs where it is undefined are counted
and left out). Signs and ties are :mod:`.compare`'s, so ``tol`` applies to every quantity.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from .compare import Scores, diff_sign, pair_signs, stack


@dataclass(frozen=True)
class SignCounts:
    n_plus: int
    n_minus: int
    n_zero: int

    @property
    def n(self) -> int:
        return self.n_plus + self.n_minus + self.n_zero

    def swapped(self) -> "SignCounts":
        return SignCounts(self.n_minus, self.n_plus, self.n_zero)


def _as_scores(x, name: str) -> Scores:
    s = Scores.coerce(x, name)
    if s.value.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional")
    return s


def sign_counts(scores_a, scores_b, tol: float | None = None) -> SignCounts:
    """N+, N-, N0 of A versus B over configs aligned by position (eq. 1)."""
    a, b = _as_scores(scores_a, "scores_a"), _as_scores(scores_b, "scores_b")
    if a.shape != b.shape:
        raise ValueError(f"score vectors differ in length ({len(a)} vs {len(b)})")
    s = diff_sign(a, b, tol)
    return SignCounts(int(np.sum(s > 0)), int(np.sum(s < 0)), int(np.sum(s == 0)))


def rho_flip(c: SignCounts) -> float:
    """min(N+, N-) / |C| (eq. 2)."""
    if c.n == 0:
        raise ValueError("rho_flip is undefined on an empty configuration set")
    return min(c.n_plus, c.n_minus) / c.n


def ceiling(n: int) -> float:
    """floor(|C|/2) / |C|, the largest value rho_flip can take on |C| configs."""
    if n <= 0:
        raise ValueError("ceiling is undefined on an empty configuration set")
    return (n // 2) / n


def d1(c: SignCounts) -> bool:
    """No strict reversal: N+ = 0 or N- = 0."""
    return c.n_plus == 0 or c.n_minus == 0


def d2(c: SignCounts) -> bool:
    """A single sign verdict: exactly one of N+, N-, N0 is non-zero."""
    return sum(x > 0 for x in (c.n_plus, c.n_minus, c.n_zero)) == 1


def saturated(c: SignCounts) -> bool:
    """rho_flip reaches its ceiling (and the ceiling is non-zero, i.e. |C| >= 2)."""
    return c.n // 2 > 0 and min(c.n_plus, c.n_minus) == c.n // 2


def pair_stats(scores_a, scores_b, tol: float | None = None) -> dict:
    c = sign_counts(scores_a, scores_b, tol)
    r = rho_flip(c)
    ceil = ceiling(c.n)
    return {
        "n_plus": c.n_plus, "n_minus": c.n_minus, "n_zero": c.n_zero, "n_configs": c.n,
        "rho_flip": r, "ceiling": ceil, "saturated": saturated(c),
        "d1": d1(c), "d2": d2(c),
    }


def _matrix(scores: Mapping[str, Sequence[float] | Scores]) -> tuple[list[str], Scores]:
    models = list(scores)
    if not models:
        raise ValueError("no models")
    cols = [_as_scores(scores[m], f"scores[{m}]") for m in models]
    if len({len(c) for c in cols}) > 1:
        raise ValueError("score vectors differ in length")
    return models, stack(cols)  # shape (n_configs, n_models)


def orderings(scores: Mapping[str, Sequence[float] | Scores], tol: float | None = None) -> dict:
    """Distinct strict total orders of the models induced by the configs.

    ``scores`` maps model -> scores over the same configs (aligned by position). Returns
    reachable (number of distinct strict orders), possible (n!), tied_configs (configs with
    at least one tie among the models, which induce no strict order) and `orders`, a Counter
    of order tuples (best model first)."""
    models, mat = _matrix(scores)
    n_cfg, n_models = mat.shape
    S, pairs = pair_signs(mat, tol)
    tied_rows = np.any(S == 0, axis=1) if pairs else np.zeros(n_cfg, bool)
    # wins[c, i]: models that model i beats on config c; in a strict order they are n-1..0
    wins = np.zeros((n_cfg, n_models), dtype=int)
    for p, (i, j) in enumerate(pairs):
        wins[:, i] += S[:, p] > 0
        wins[:, j] += S[:, p] < 0
    orders: Counter = Counter()
    for c in np.flatnonzero(~tied_rows):
        orders[tuple(models[i] for i in np.argsort(-wins[c], kind="stable"))] += 1
    return {"reachable": len(orders), "possible": math.factorial(n_models), "tied_configs": int(tied_rows.sum()),
            "n_configs": n_cfg, "orders": orders}


def tau_r(scores: Mapping[str, Sequence[float] | Scores], tol: float | None = None) -> dict:
    """Mean Kendall tau-b between model rankings over all pairs of configs.

    With S[c, p] = sign(s_i(c) - s_j(c)) over model pairs p (the tie rule of :mod:`compare`)
    and nz(c) its untied pairs, tau_b(c, c') = S_c . S_c' / sqrt(nz(c) nz(c')). With
    u_c = S_c / sqrt(nz(c)) over the V configs with nz > 0, the sum over config pairs is
    (|sum_c u_c|^2 - V) / 2: memory and time linear in the configs."""
    _, mat = _matrix(scores)
    n_cfg, n_models = mat.shape
    total = n_cfg * (n_cfg - 1) // 2
    if n_models < 2 or n_cfg < 2:
        return {"tau_r": float("nan"), "pairs_used": 0, "pairs_undefined": total}
    S, _ = pair_signs(mat, tol)
    nz = np.count_nonzero(S, axis=1)
    ok = nz > 0
    v = int(ok.sum())
    used = v * (v - 1) // 2
    if used == 0:
        return {"tau_r": float("nan"), "pairs_used": 0, "pairs_undefined": total}
    u = S[ok].astype(float) / np.sqrt(nz[ok])[:, None]
    tot = u.sum(axis=0)
    return {"tau_r": float((tot @ tot - v) / 2 / used), "pairs_used": used, "pairs_undefined": total - used}
