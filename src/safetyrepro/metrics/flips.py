"""Verdict-flip metrics for one benchmark over a configuration set C.

Definitions (the paper's numbering):

* eq. (1)  For an ordered model pair (A, B) and config c, d_c = s_A(c) - s_B(c).
  N+ = #{c : d_c > 0}, N- = #{c : d_c < 0}, N0 = #{c : d_c = 0}; |C| = N+ + N- + N0.
* eq. (2)  rho_flip(A, B) = min(N+, N-) / |C|. Ties stay in the denominator.
* Prop. 1  (i) rho_flip = 0 iff D1: no strict reversal (N+ = 0 or N- = 0).
  (ii) D2, a single sign verdict (exactly one of N+, N-, N0 non-zero), implies D1.
  (iii) rho_flip <= floor(|C|/2)/|C| (the ceiling); `saturated` when it is reached.
* Orderings reachable: the number of distinct strict total orders of the models that some
  config induces (of n! possible); configs with any tied pair induce no strict order and are
  counted separately.
* tau_R: the mean, over all unordered pairs of configurations {c, c'} in C, of Kendall's tau-b
  between the model rankings (score vectors over the models) under c and c'. Pairs where
  tau-b is undefined (all models tied under c or c') are left out and counted.

Scores are compared exactly (tol = 0) unless a tolerance is given: |d_c| <= tol is a tie.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np


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


def _as_array(x: Sequence[float], name: str) -> np.ndarray:
    arr = np.asarray(x, dtype=float)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or infinite scores")
    return arr


def sign_counts(scores_a: Sequence[float], scores_b: Sequence[float], tol: float = 0.0) -> SignCounts:
    """N+, N-, N0 of A versus B over configs aligned by position (eq. 1)."""
    a, b = _as_array(scores_a, "scores_a"), _as_array(scores_b, "scores_b")
    if a.shape != b.shape:
        raise ValueError(f"score vectors differ in length ({a.size} vs {b.size})")
    d = a - b
    return SignCounts(int(np.sum(d > tol)), int(np.sum(d < -tol)), int(np.sum(np.abs(d) <= tol)))


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


def pair_stats(scores_a: Sequence[float], scores_b: Sequence[float], tol: float = 0.0) -> dict:
    c = sign_counts(scores_a, scores_b, tol)
    r = rho_flip(c)
    ceil = ceiling(c.n)
    return {
        "n_plus": c.n_plus, "n_minus": c.n_minus, "n_zero": c.n_zero, "n_configs": c.n,
        "rho_flip": r, "ceiling": ceil, "saturated": saturated(c),
        "d1": d1(c), "d2": d2(c),
    }


def _matrix(scores: Mapping[str, Sequence[float]]) -> tuple[list[str], np.ndarray]:
    models = list(scores)
    if not models:
        raise ValueError("no models")
    mat = np.vstack([_as_array(scores[m], f"scores[{m}]") for m in models])
    return models, mat  # shape (n_models, n_configs)


def orderings(scores: Mapping[str, Sequence[float]], tol: float = 0.0) -> dict:
    """Distinct strict total orders of the models induced by the configs.

    ``scores`` maps model -> scores over the same configs (aligned by position). Returns
    reachable (number of distinct strict orders), possible (n!), tied_configs (configs with
    at least one tie among the models, which induce no strict order) and `orders`, a Counter
    of order tuples (best model first)."""
    models, mat = _matrix(scores)
    n_models, n_cfg = mat.shape
    orders: Counter = Counter()
    tied = 0
    for j in range(n_cfg):
        col = mat[:, j]
        if any(abs(col[i] - col[k]) <= tol for i, k in itertools.combinations(range(n_models), 2)):
            tied += 1
            continue
        orders[tuple(models[i] for i in np.argsort(-col, kind="stable"))] += 1
    return {"reachable": len(orders), "possible": math.factorial(n_models), "tied_configs": tied,
            "n_configs": n_cfg, "orders": orders}


def tau_r(scores: Mapping[str, Sequence[float]]) -> dict:
    """Mean Kendall tau-b between model rankings over all pairs of configs (see module doc).

    Vectorised: with S[c, p] = sign(s_i(c) - s_j(c)) over model pairs p = (i, j),
    tau_b(c, c') = sum_p S[c,p] S[c',p] / sqrt(nz(c) nz(c')) where nz counts untied pairs;
    this is Kendall's tau-b (concordant minus discordant over the tie-corrected norm)."""
    _, mat = _matrix(scores)
    n_models, n_cfg = mat.shape
    pairs = list(itertools.combinations(range(n_models), 2))
    if not pairs or n_cfg < 2:
        return {"tau_r": float("nan"), "pairs_used": 0, "pairs_undefined": n_cfg * (n_cfg - 1) // 2}
    S = np.stack([np.sign(mat[i] - mat[j]) for i, j in pairs], axis=1)  # (n_cfg, n_pairs)
    nz = np.count_nonzero(S, axis=1).astype(float)
    num = S @ S.T
    denom = np.sqrt(np.outer(nz, nz))
    iu = np.triu_indices(n_cfg, k=1)
    num, denom = num[iu], denom[iu]
    ok = denom > 0
    taus = num[ok] / denom[ok]
    return {"tau_r": float(np.mean(taus)) if taus.size else float("nan"),
            "pairs_used": int(ok.sum()), "pairs_undefined": int((~ok).sum())}
