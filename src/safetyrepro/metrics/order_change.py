"""The total-order change rate (the paper's total-order "flip rate"; NOT rho_flip).

The share of unordered config pairs {c, c'} whose induced (weak) orders of the models differ,
with signs and ties from :mod:`.compare`. It counts whether two rankings differ, next to
tau_R, which weighs how much. Under independent continuous scores the expected rate is
1 - 1/|M|! (5/6 for three models). Definitions: docs/VERDICTS.md section 4.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Mapping

import numpy as np

from .compare import Scores, pair_signs, stack


def order_change_rate(scores: Mapping[str, object], tol: float | None = None) -> dict:
    """``scores``: model -> scores over the same configs (aligned by position; floats or
    :class:`~safetyrepro.metrics.compare.Scores`).

    Returns order_change_rate (NaN for fewer than two configs), config_pairs,
    config_pairs_changed, weak_order_configs (configs with at least one tie among the models),
    distinct_orders (weak orders included) and null_rate = 1 - 1/|M|!."""
    models = list(scores)
    if len(models) < 2:
        raise ValueError("the total-order change rate needs at least two models")
    mat = stack([Scores.coerce(scores[m], f"scores[{m}]") for m in models])   # (n_configs, n_models)
    signs, _ = pair_signs(mat, tol)
    n_cfg = signs.shape[0]
    groups = Counter(map(bytes, np.ascontiguousarray(signs)))
    pairs = n_cfg * (n_cfg - 1) // 2
    same = sum(k * (k - 1) // 2 for k in groups.values())
    return {"order_change_rate": (pairs - same) / pairs if pairs else float("nan"),
            "config_pairs": pairs, "config_pairs_changed": pairs - same,
            "weak_order_configs": int(np.sum(np.any(signs == 0, axis=1))),
            "distinct_orders": len(groups), "null_rate": 1.0 - 1.0 / math.factorial(len(models))}
