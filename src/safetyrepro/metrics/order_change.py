"""The total-order change rate (the paper's total-order "flip rate"; NOT rho_flip).

For one benchmark with models M and configuration set C, every config c induces an order of
the models by score (a weak order when some models tie: tied models share a place). The
total-order change rate is the share of unordered config pairs {c, c'} (|C|(|C|-1)/2 of them)
whose induced orders differ:

    order_change_rate = #{ {c, c'} : order(c) != order(c') } / (|C| choose 2)

It is a property of the whole ranking, reported next to tau_R (which weighs how much two
orders differ; this counts whether they differ at all). rho_flip, by contrast, is per model
pair: min(N+, N-)/|C|. Two configs induce the same order iff every model pair has the same
sign (A ahead, B ahead, tie) under both, with signs and ties from
:mod:`safetyrepro.metrics.compare`. Null reference: if every config's scores were independent
draws from a continuous distribution, each config would induce each of the |M|! strict
orders with probability 1/|M|!, so two configs agree with probability 1/|M|! and the expected
rate is 1 - 1/|M|! (5/6 for three models).
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
