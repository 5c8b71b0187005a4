"""The one definition of "A > B on config c" (and of a tie) that every verdict uses.

A score is a :class:`Scores` array: the float value and, where it comes from counts, the exact
fraction ``num / den``. :func:`tie_rule` picks the rule for sign(A - B): ``exact`` (fractions
compared in integers, so equal counts tie whatever the float means' last bit), ``absolute``
(``tol > 0``: |A - B| <= tol ties, decided in decimal as written) or ``relative`` (plain floats:
equal within :data:`REL_TIE`). Everything that forms a sign, ordering, tie or rank goes through
:func:`diff_sign`, :func:`pair_signs` or :func:`weak_ranks`. Definitions: docs/VERDICTS.md
section 1.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

REL_TIE = 1e-12
EXACT, ABSOLUTE, RELATIVE = "exact", "absolute", "relative"


@dataclass(frozen=True)
class TieRule:
    kind: str            # exact | absolute | relative
    tol: float = 0.0     # absolute: the tolerance; relative: REL_TIE; exact: 0

    def describe(self) -> str:
        if self.kind == EXACT:
            return "exact: scores compared as fractions of counts (num/den); equal fractions tie"
        if self.kind == ABSOLUTE:
            return f"absolute: |difference| <= {self.tol:g} is a tie (--tol)"
        return f"relative: |difference| <= {self.tol:g} x max(|a|, |b|) is a tie (no --tol given; float scores)"

    def as_dict(self) -> dict:
        return {"kind": self.kind, "tol": float(self.tol), "text": self.describe()}


def _check_tol(tol: float | None) -> float:
    t = 0.0 if tol is None else float(tol)
    if not np.isfinite(t) or t < 0:
        raise ValueError(f"tolerance must be a finite number >= 0 (got {tol!r})")
    return t


def tie_rule(tol: float | None = None, exact: bool = False) -> TieRule:
    """The rule used for a comparison: ``tol > 0`` -> absolute; else exact when both sides
    carry fractions; else relative (REL_TIE)."""
    t = _check_tol(tol)
    if t > 0:
        return TieRule(ABSOLUTE, t)
    return TieRule(EXACT, 0.0) if exact else TieRule(RELATIVE, REL_TIE)


class Scores:
    """Scores (any shape) with optional exact fractions ``num / den`` (int64, den > 0).

    ``value`` is the float shown in tables; when fractions are given it is num/den (one
    rounding), so the display and the comparison can never disagree about which is larger."""

    __slots__ = ("value", "num", "den")

    def __init__(self, value=None, num=None, den=None):
        if (num is None) != (den is None):
            raise ValueError("num and den come together")
        if num is not None:
            n = np.asarray(num)
            d = np.asarray(den)
            if not (np.issubdtype(n.dtype, np.integer) and np.issubdtype(d.dtype, np.integer)):
                nf, df = np.asarray(n, float), np.asarray(d, float)
                if not (np.all(np.isfinite(nf)) and np.all(nf == np.round(nf)) and np.all(df == np.round(df))):
                    raise ValueError("num and den must be integers")
            n, d = np.asarray(n, dtype=np.int64), np.asarray(d, dtype=np.int64)
            n, d = np.broadcast_arrays(n, d)
            if np.any(d <= 0):
                raise ValueError("den must be > 0")
            self.num, self.den = n, d
            self.value = n / d
        else:
            v = np.asarray(value, dtype=float)
            if not np.all(np.isfinite(v)):
                raise ValueError("scores contain NaN or infinite values")
            self.num = self.den = None
            self.value = v

    @property
    def exact(self) -> bool:
        return self.num is not None

    @property
    def shape(self) -> tuple:
        return self.value.shape

    def __len__(self) -> int:
        return len(self.value)

    def __getitem__(self, idx) -> "Scores":
        if self.exact:
            return Scores(num=self.num[idx], den=self.den[idx])
        return Scores(self.value[idx])

    def __repr__(self) -> str:
        if self.exact:
            return f"Scores(num={self.num.tolist()}, den={self.den.tolist()})"
        return f"Scores({self.value.tolist()})"

    @classmethod
    def coerce(cls, x, name: str = "scores") -> "Scores":
        if isinstance(x, Scores):
            return x
        try:
            return cls(x)
        except ValueError as exc:
            raise ValueError(f"{name}: {exc}") from None


def diff_sign(a, b, tol: float | None = None) -> np.ndarray:
    """Elementwise sign of A - B under the tie rule (+1: A ahead, -1: B ahead, 0: tie).
    Broadcasts like numpy. The one definition of "A > B"."""
    a, b = Scores.coerce(a, "scores_a"), Scores.coerce(b, "scores_b")
    rule = tie_rule(tol, a.exact and b.exact)
    return _sign(a, b, rule)


def _sign(a: Scores, b: Scores, rule: TieRule) -> np.ndarray:
    if a.exact and b.exact:
        cross = a.num * b.den - b.num * a.den          # exact in int64 for counts < ~3e9
        if rule.kind == EXACT:
            return np.sign(cross).astype(np.int8)
        if rule.kind == ABSOLUTE:
            return _sign_within(cross, a.den * b.den, decimal_fraction(rule.tol))
        d = cross / (a.den * b.den)
    else:
        d = a.value - b.value
        if rule.kind == ABSOLUTE:
            return _float_sign_within(a.value, b.value, d, rule.tol)
    thr = rule.tol * np.maximum(np.abs(a.value), np.abs(b.value)) if rule.kind == RELATIVE else 0.0
    return (np.where(d > thr, 1, 0) - np.where(d < -thr, 1, 0)).astype(np.int8)


def decimal_fraction(x: float) -> Fraction:
    """The decimal a float prints as (its shortest round-trip repr), exactly: 0.1 -> 1/10."""
    return Fraction(Decimal(repr(float(x))))


def _sign_within(cross: np.ndarray, den: np.ndarray, tol: Fraction) -> np.ndarray:
    """sign(cross/den) with |cross/den| <= tol a tie, in integers (Python ints past int64)."""
    p, q = tol.numerator, tol.denominator
    cross, den = np.broadcast_arrays(np.asarray(cross, dtype=np.int64), np.asarray(den, dtype=np.int64))
    big = max(int(np.abs(cross).max(initial=0)) * q, int(np.abs(den).max(initial=0)) * p)
    if big < 2**62:
        c, thr = cross * q, den * p
    else:
        c, thr = cross.astype(object) * q, den.astype(object) * p
    return (np.where(c > thr, 1, 0) - np.where(c < -thr, 1, 0)).astype(np.int8)


def _float_sign_within(a: np.ndarray, b: np.ndarray, d: np.ndarray, tol: float) -> np.ndarray:
    """sign(a - b) with |a - b| <= tol a tie, a, b and tol read as their shortest decimals. The
    float difference decides wherever it is farther from the threshold than its rounding error
    (a few ulps of |a| + |b|); the few cases nearer are decided in Decimal."""
    a, b, d = np.broadcast_arrays(np.asarray(a, float), np.asarray(b, float), np.asarray(d, float))
    out = (np.where(d > tol, 1, 0) - np.where(d < -tol, 1, 0)).astype(np.int8)
    err = 4 * np.finfo(float).eps * (np.abs(a) + np.abs(b) + tol) + np.finfo(float).tiny
    close = np.abs(np.abs(d) - tol) <= err
    if close.any():
        t = Decimal(repr(float(tol)))
        for idx in zip(*np.nonzero(close)):
            diff = Decimal(repr(float(a[idx]))) - Decimal(repr(float(b[idx])))
            out[idx] = 0 if abs(diff) <= t else (1 if diff > 0 else -1)
    return out


def rule_for(scores: Sequence | Mapping, tol: float | None = None) -> TieRule:
    """The rule :func:`diff_sign` applies to these scores (all exact -> exact, unless tol)."""
    vals = list(scores.values()) if isinstance(scores, Mapping) else list(scores)
    exact = bool(vals) and all(isinstance(v, Scores) and v.exact for v in vals)
    return tie_rule(tol, exact)


def stack(columns: Sequence) -> Scores:
    """Stack 1-D score vectors (models) into a (n_configs, n_models) Scores."""
    cols = [Scores.coerce(c) for c in columns]
    if cols and all(c.exact for c in cols):
        return Scores(num=np.stack([c.num for c in cols], axis=-1), den=np.stack([c.den for c in cols], axis=-1))
    return Scores(np.stack([c.value for c in cols], axis=-1))


def pair_signs(mat: Scores, tol: float | None = None) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """S[c, p] = sign(s_i(c) - s_j(c)) for model pairs p = (i, j), i < j, of a
    (n_configs, n_models) Scores. Returns (S as int8, pairs)."""
    n_models = mat.shape[-1]
    pairs = list(itertools.combinations(range(n_models), 2))
    if not pairs:
        return np.zeros(mat.shape[:-1] + (0,), dtype=np.int8), pairs
    i = np.array([p[0] for p in pairs])
    j = np.array([p[1] for p in pairs])
    return diff_sign(mat[..., i], mat[..., j], tol), pairs


def weak_ranks(scores, tol: float | None = None) -> tuple[int, ...]:
    """Rank of each model (0 = best; models in a fixed order): the number of models strictly
    better under the tie rule, so tied models share a rank. Two configs induce the same
    ordering (ties included) iff their weak-rank tuples are equal."""
    s = Scores.coerce(scores)
    if s.value.ndim != 1:
        raise ValueError("weak_ranks takes one score per model")
    better = diff_sign(s[None, :], s[:, None], tol) > 0     # better[i, k]: model k beats model i
    return tuple(int(x) for x in better.sum(axis=1))


# ------------------------------------------------------------------ long tables -> grids

EXACT_COLUMNS = ("score_num", "score_den")


def has_exact(df: pd.DataFrame) -> bool:
    return all(c in df.columns for c in EXACT_COLUMNS)


def scores_of(df: pd.DataFrame, suffix: str = "") -> Scores:
    """The scores of a table's rows: exact from ``score_num<suffix>``/``score_den<suffix>``
    when both columns are there, else the floats of ``score<suffix>``."""
    num, den = f"score_num{suffix}", f"score_den{suffix}"
    if num in df.columns and den in df.columns:
        return Scores(num=df[num].to_numpy(dtype=np.int64), den=df[den].to_numpy(dtype=np.int64))
    return Scores(df[f"score{suffix}"].to_numpy(dtype=float))


@dataclass
class ScoreGrid:
    """One benchmark's configs x models scores (sorted configs and models), exact where the
    long table carries ``score_num``/``score_den``."""

    configs: list[str]
    models: list[str]
    scores: Scores       # shape (n_configs, n_models)

    @property
    def exact(self) -> bool:
        return self.scores.exact

    @property
    def empty(self) -> bool:
        return not self.configs or not self.models

    @property
    def shape(self) -> tuple[int, int]:
        return (len(self.configs), len(self.models))

    def column(self, model: str) -> Scores:
        return self.scores[:, self.models.index(model)]

    def columns(self) -> dict[str, Scores]:
        return {m: self.column(m) for m in self.models}

    def rows(self, idx) -> "ScoreGrid":
        idx = np.asarray(idx)
        return ScoreGrid([self.configs[i] for i in idx], self.models, self.scores[idx])

    def frame(self) -> pd.DataFrame:
        """configs x models float scores (for display)."""
        return pd.DataFrame(self.scores.value, index=pd.Index(self.configs, name="config"),
                            columns=pd.Index(self.models, name="model"))


def score_grid(df: pd.DataFrame, benchmark: str | None = None, configs=None) -> ScoreGrid:
    """The grid of one benchmark (``benchmark=None``: the table must hold one benchmark)."""
    sub = df if benchmark is None else df[df["benchmark"] == benchmark]
    if configs is not None:
        sub = sub[sub["config"].isin(list(configs))]
    cfgs = sorted(sub["config"].unique())
    models = sorted(sub["model"].unique())
    if not cfgs or not models:
        return ScoreGrid([], [], Scores(np.zeros((0, 0))))
    def wide(col: str) -> np.ndarray:
        w = sub.pivot(index="config", columns="model", values=col).reindex(index=cfgs, columns=models)
        if w.isna().to_numpy().any():
            c, m = next((c, m) for c in cfgs for m in models if pd.isna(w.loc[c, m]))
            raise ValueError(f"no '{col}' for model {m!r} on config {c!r}"
                             + (f" of benchmark {benchmark!r}" if benchmark else "")
                             + ": drop incomplete configs first")
        return w.to_numpy()

    if has_exact(sub):
        return ScoreGrid(cfgs, models, Scores(num=wide("score_num").astype(np.int64),
                                              den=wide("score_den").astype(np.int64)))
    return ScoreGrid(cfgs, models, Scores(wide("score").astype(float)))
