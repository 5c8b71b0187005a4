"""The one definition of "A > B on config c" (metrics.compare) on hand-computed cases, the
issue's tie example included: five seeds of 12 items with 18 + 10 ... correct answers."""

import numpy as np
import pandas as pd
import pytest

from safetyrepro.analysis.common import weak_ranks
from safetyrepro.metrics import orderings, pair_stats, sign_counts, tau_r
from safetyrepro.metrics.compare import Scores, diff_sign, score_grid, tie_rule

# the example: 28 of 60 correct either way, but the float means differ in the last bit
SEEDS_A = [8, 2, 4, 2, 12]
SEEDS_B = [7, 2, 5, 2, 12]
MEAN_A = float(np.mean([k / 12 for k in SEEDS_A]))
MEAN_B = float(np.mean([k / 12 for k in SEEDS_B]))


def test_the_example_differs_as_floats():
    assert sum(SEEDS_A) == sum(SEEDS_B) == 28
    assert MEAN_A != MEAN_B          # 0.4666666666666666 vs 0.4666666666666667


def test_exact_fractions_tie_where_float_means_do_not():
    a = Scores(num=[28, 30, 10], den=[60, 60, 12])
    b = Scores(num=[28, 29, 50], den=[60, 60, 60])    # 10/12 == 50/60
    assert diff_sign(a, b).tolist() == [0, 1, 0]
    assert tie_rule(None, True).kind == "exact"
    c = sign_counts(a, b)
    assert (c.n_plus, c.n_minus, c.n_zero) == (1, 0, 2)
    # the same float means, compared bit for bit, would call the first config a strict win
    assert np.sign(MEAN_A - MEAN_B) != 0


def test_float_scores_tie_within_relative_1e12_and_tolerance_applies():
    s = sign_counts([MEAN_A, 0.5, 0.3], [MEAN_B, 0.5 + 1e-9, 0.2])
    assert (s.n_plus, s.n_minus, s.n_zero) == (1, 1, 1)
    s = sign_counts([MEAN_A, 0.5, 0.3], [MEAN_B, 0.5 + 1e-9, 0.2], tol=1e-6)
    assert (s.n_plus, s.n_minus, s.n_zero) == (1, 0, 2)
    assert tie_rule(1e-6).kind == "absolute" and tie_rule(None).kind == "relative"
    with pytest.raises(ValueError):
        tie_rule(-1.0)


def test_tolerance_on_exact_fractions():
    a, b = Scores(num=[31, 28], den=[60, 60]), Scores(num=[30, 28], den=[60, 60])
    assert diff_sign(a, b, 0.02).tolist() == [0, 0]     # 1/60 < 0.02
    assert diff_sign(a, b, 0.01).tolist() == [1, 0]


def test_orderings_tau_and_ranks_see_the_exact_tie():
    # three models, two configs; on c0 A and B tie exactly (28/60 each), C is last
    cols = {"A": Scores(num=[28, 40], den=[60, 60]), "B": Scores(num=[28, 30], den=[60, 60]),
            "C": Scores(num=[10, 50], den=[60, 60])}
    o = orderings(cols)
    assert o["tied_configs"] == 1 and o["reachable"] == 1 and list(o["orders"]) == [("C", "A", "B")]
    floats = {m: v.value.copy() for m, v in cols.items()}
    floats["A"][0], floats["B"][0] = MEAN_A, MEAN_B   # the same tie as last-bit floats
    assert orderings(floats)["tied_configs"] == 1     # relative 1e-12 rule
    # tau-b: c0 signs (A-B, A-C, B-C) = (0, +, +); c1 = (+, -, -): (0 - 2)/sqrt(2*3)
    t = tau_r(cols)
    assert t["tau_r"] == pytest.approx(-2 / np.sqrt(6)) and t["pairs_used"] == 1
    # the tolerance reaches tau_R too: under tol 0.2, c1's gaps of 1/6 tie: c1 = (0, 0, -)
    assert tau_r(cols, tol=0.2)["tau_r"] == pytest.approx(-1 / np.sqrt(2))


def test_weak_ranks_exact():
    row = Scores(num=[28, 28, 10], den=[60, 60, 60])
    assert weak_ranks(row) == (0, 0, 2)
    assert weak_ranks([MEAN_A, MEAN_B, 0.1]) == (0, 0, 2)
    assert weak_ranks([0.5, 0.4, 0.45], tol=0.06) == (0, 1, 0)


def test_pair_stats_and_grid_from_long_table():
    df = pd.DataFrame({"model": ["A", "B", "A", "B"], "benchmark": "bbq", "config": ["c1", "c1", "c2", "c2"],
                       "score": [MEAN_A, MEAN_B, 0.5, 0.25],
                       "score_num": [28, 28, 30, 15], "score_den": [60, 60, 60, 60]})
    g = score_grid(df, "bbq")
    assert g.exact and g.configs == ["c1", "c2"] and g.models == ["A", "B"]
    st = pair_stats(g.column("A"), g.column("B"))
    assert (st["n_plus"], st["n_minus"], st["n_zero"], st["d1"], st["d2"]) == (1, 0, 1, True, False)


def _seed_results(model: str, config: str, seeds: list[int], n_items: int = 12) -> list[dict]:
    rows = []
    for s, k in enumerate(seeds):
        for i in range(n_items):
            rows.append({"model": model, "config": config, "seed": s, "item_id": f"i{i:02d}", "correct": i < k})
    return rows


def test_subsample_counts_and_ordering_see_the_exact_tie():
    from safetyrepro.analysis.subsample import ItemMatrix, _orders

    res = pd.DataFrame(_seed_results("A", "c1", SEEDS_A) + _seed_results("B", "c1", SEEDS_B))
    m = ItemMatrix(res)
    counts = m.cell_counts()
    assert counts.loc[("A", "c1"), "score_num"] == counts.loc[("B", "c1"), "score_num"] == 28
    assert counts.loc[("A", "c1"), "score_den"] == 60
    assert _orders(counts, ["c1"], ["A", "B"], None) == {"c1": (0, 0)}
    # the old float path (mean over seeds of per-seed means) would have ranked them
    per_seed = res.groupby(["model", "seed"])["correct"].mean().groupby("model").mean()
    assert per_seed["A"] != per_seed["B"]


def test_shap_sign_classifier_drops_the_exact_tie():
    from safetyrepro.analysis.variance import fit_sign_classifier

    cfgs = ["T1-greedy-k0-freeform", "T1-t0.7-k0-freeform", "T2-greedy-k0-freeform"]
    df = pd.DataFrame({"model": ["A", "B"] * 3, "benchmark": "bbq", "config": np.repeat(cfgs, 2),
                       "score": [MEAN_A, MEAN_B, 0.6, 0.5, 0.5, 0.6],
                       "score_num": [28, 28, 36, 30, 30, 36], "score_den": [60] * 6})
    g = score_grid(df, "bbq")
    levels = pd.DataFrame({"template": ["T1", "T1", "T2"], "decoding": ["greedy", "t0.7", "greedy"],
                           "shots": "k0", "scoring": "freeform"}, index=cfgs)
    _, _, n_rows, n_ties, _ = fit_sign_classifier(g, levels, "A", "B")
    assert (n_rows, n_ties) == (2, 1)
