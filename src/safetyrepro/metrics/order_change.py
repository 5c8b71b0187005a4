"""The total-order change rate (the paper's total-order "flip rate"; NOT rho_flip).

For one benchmark with models M and configuration set C, every config c induces an order of
the models by score (a weak order when some models tie: tied models share a place). The
total-order change rate is the share of unordered config pairs {c, c'} (|C|(|C|-1)/2 of them)
whose induced orders differ:

    order_change_rate = #{ {c, c'} : order(c) != order(c') } / (|C| choose 2)

It is a property of the whole ranking, reported next to tau_R (which weighs how much two
orders differ; this counts whether they differ at all). rho_flip, by contrast, is per model
pair: min(N+, N-)/|C|. Null reference: if every config's scores were independent draws from a
continuous distribution, each config would induce each of the |M|! strict orders with
probability 1/|M|!, so two configs agree with probability 1/|M|! and the expected rate is
1 - 1/|M|! (5/6 for three models).
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Mapping, Sequence

import numpy as np

from .signs import pair_sign_matrix


def order_change_rate(scores: Mapping[str, Sequence[float]], tol: float = 0.0) -> dict:
    """``scores``: model -> scores over the same configs (aligned by position).

    Returns order_change_rate (NaN for fewer than two configs), config_pairs,
    config_pairs_changed, weak_order_configs (configs with at least one tie among the models),
    distinct_orders (weak orders included) and null_rate = 1 - 1/|M|!."""
    models = list(scores)
    if len(models) < 2:
        raise ValueError("the total-order change rate needs at least two models")
    mat = np.vstack([np.asarray(scores[m], dtype=float) for m in models])
    if not np.all(np.isfinite(mat)):
        raise ValueError("scores contain NaN or infinite values")
    n_cfg = mat.shape[1]
    signs = pair_sign_matrix(mat, tol)
    groups = Counter(map(bytes, signs))
    pairs = n_cfg * (n_cfg - 1) // 2
    same = sum(k * (k - 1) // 2 for k in groups.values())
    return {"order_change_rate": (pairs - same) / pairs if pairs else float("nan"),
            "config_pairs": pairs, "config_pairs_changed": pairs - same,
            "weak_order_configs": int(np.sum(np.any(signs == 0, axis=1))),
            "distinct_orders": len(groups), "null_rate": 1.0 - 1.0 / math.factorial(len(models))}
