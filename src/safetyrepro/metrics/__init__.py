"""The paper's metrics: sign counts, rho_flip, its ceiling, Prop. 1's D1/D2, orderings
reachable, tau_R, the total-order change rate, the nearest reversing configuration; and the
per-benchmark tables built from them."""

from .compare import REL_TIE, ScoreGrid, Scores, TieRule, diff_sign, pair_signs, rule_for, score_grid, tie_rule, weak_ranks
from .flips import (
    SignCounts,
    ceiling,
    d1,
    d2,
    orderings,
    pair_stats,
    rho_flip,
    sign_counts,
    tau_r,
)
from .order_change import order_change_rate
from .reversal import nearest_reversal_table, reversal_line
from .tables import benchmark_summary, pairwise_table, score_matrix

__all__ = [
    "SignCounts", "ceiling", "d1", "d2", "orderings", "pair_stats", "rho_flip", "sign_counts",
    "tau_r", "benchmark_summary", "pairwise_table", "score_matrix", "order_change_rate",
    "nearest_reversal_table", "reversal_line",
    "REL_TIE", "ScoreGrid", "Scores", "TieRule", "diff_sign", "pair_signs", "rule_for", "score_grid",
    "tie_rule", "weak_ranks",
]
