"""Which model is ahead on each config: the comparison the nearest-reversal and the
total-order change rate are built on.

``config_signs(a, b, tol)`` is +1 where A scores higher than B on a config, -1 where B does,
0 for a tie (|s_A - s_B| <= tol). It is the single comparison these two metrics make, kept in
one function so that it follows the project's definition of "A > B on config c"."""

from __future__ import annotations

from typing import Sequence

import numpy as np


def config_signs(scores_a: Sequence[float], scores_b: Sequence[float], tol: float = 0.0) -> np.ndarray:
    """sign(s_A(c) - s_B(c)) per config, with |difference| <= tol a tie (0)."""
    a = np.asarray(scores_a, dtype=float)
    b = np.asarray(scores_b, dtype=float)
    if a.shape != b.shape:
        raise ValueError(f"score vectors differ in shape ({a.shape} vs {b.shape})")
    d = a - b
    return np.where(d > tol, 1, np.where(d < -tol, -1, 0)).astype(np.int8)


def pair_sign_matrix(mat: np.ndarray, tol: float = 0.0) -> np.ndarray:
    """(n_configs, n_model_pairs) signs for a (n_models, n_configs) score matrix; model pairs
    (i, j), i < j, in itertools.combinations order. Two configs induce the same (weak) order
    of the models iff their rows are equal."""
    n = mat.shape[0]
    cols = [config_signs(mat[i], mat[j], tol) for i in range(n) for j in range(i + 1, n)]
    if not cols:
        return np.zeros((mat.shape[1], 0), dtype=np.int8)
    return np.stack(cols, axis=1)
