import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from safetyrepro.metrics import (SignCounts, benchmark_summary, ceiling, d1, d2, orderings, pair_stats,
                                 pairwise_table, rho_flip, sign_counts, tau_r)

# Scores drawn from a small grid so that ties actually occur.
score = st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0])
paired = st.integers(1, 40).flatmap(lambda n: st.tuples(st.lists(score, min_size=n, max_size=n),
                                                        st.lists(score, min_size=n, max_size=n)))


# ---- hand-computed examples ---------------------------------------------------------------
def test_hand_example_with_ties():
    a = [0.6, 0.5, 0.4, 0.7, 0.5]
    b = [0.5, 0.5, 0.6, 0.6, 0.4]
    c = sign_counts(a, b)
    assert (c.n_plus, c.n_minus, c.n_zero) == (3, 1, 1)
    assert rho_flip(c) == pytest.approx(1 / 5)  # the tie stays in the denominator
    assert ceiling(5) == pytest.approx(2 / 5)
    s = pair_stats(a, b)
    assert not s["d1"] and not s["d2"] and not s["saturated"]


def test_saturated_example():
    s = pair_stats([1, 0, 1, 0], [0, 1, 0, 1])
    assert s["rho_flip"] == 0.5 and s["ceiling"] == 0.5 and s["saturated"]
    s = pair_stats([1, 0, 1], [0, 1, 0])  # odd |C|: ceiling 1/3
    assert s["rho_flip"] == pytest.approx(1 / 3) and s["saturated"]


def test_d1_without_d2():
    s = pair_stats([1, 1, 0.5], [0, 0, 0.5])  # A wins twice, one tie: no reversal, two signs
    assert s["rho_flip"] == 0 and s["d1"] and not s["d2"]
    s = pair_stats([1, 1], [0, 0])
    assert s["d1"] and s["d2"]


def test_tolerance_turns_small_differences_into_ties():
    c = sign_counts([0.501, 0.6], [0.5, 0.5], tol=0.01)
    assert (c.n_plus, c.n_minus, c.n_zero) == (1, 0, 1)


def test_nan_rejected():
    with pytest.raises(ValueError, match="NaN"):
        sign_counts([0.1, float("nan")], [0.2, 0.3])
    with pytest.raises(ValueError):
        rho_flip(SignCounts(0, 0, 0))


def test_orderings_hand_example():
    scores = {"x": [3, 1, 2, 1], "y": [2, 2, 1, 1], "z": [1, 3, 3, 0]}
    o = orderings(scores)
    # config 0: x>y>z ; config 1: z>y>x ; config 2: z>x>y ; config 3: x=y tie
    assert o["reachable"] == 3 and o["possible"] == 6 and o["tied_configs"] == 1
    assert o["orders"][("x", "y", "z")] == 1


def test_tau_r_hand_example():
    # identical rankings everywhere -> 1; one reversed config among two -> -1
    assert tau_r({"a": [1, 2], "b": [2, 3], "c": [3, 4]})["tau_r"] == pytest.approx(1.0)
    assert tau_r({"a": [1, 3], "b": [2, 2], "c": [3, 1]})["tau_r"] == pytest.approx(-1.0)
    # three configs: rankings abc, abc, cba -> pairs (1, -1, -1) -> mean -1/3
    r = tau_r({"a": [3, 3, 1], "b": [2, 2, 2], "c": [1, 1, 3]})
    assert r["tau_r"] == pytest.approx(-1 / 3) and r["pairs_used"] == 3
    # an all-tied config makes its pairs undefined; they are counted, not averaged
    r = tau_r({"a": [1, 5, 5], "b": [2, 5, 6], "c": [3, 5, 7]})
    assert r["pairs_undefined"] == 2 and r["tau_r"] == pytest.approx(1.0)


def test_tables_on_crafted_grid():
    rows = []
    for cfg, (sa, sb, sc) in {"c1": (0.9, 0.5, 0.1), "c2": (0.4, 0.5, 0.1), "c3": (0.4, 0.4, 0.6),
                               "c4": (0.8, 0.2, 0.3)}.items():
        rows += [("A", "bbq", cfg, sa), ("B", "bbq", cfg, sb), ("C", "bbq", cfg, sc)]
    df = pd.DataFrame(rows, columns=["model", "benchmark", "config", "score"])
    p = pairwise_table(df).set_index(["model_a", "model_b"])
    assert tuple(p.loc[("A", "B"), ["n_plus", "n_minus", "n_zero"]]) == (2, 1, 1)
    assert p.loc[("A", "B"), "rho_flip"] == pytest.approx(0.25)
    assert tuple(p.loc[("B", "C"), ["n_plus", "n_minus", "n_zero"]]) == (2, 2, 0)
    assert p.loc[("B", "C"), "saturated"]
    s = benchmark_summary(df).iloc[0]
    assert s["max_rho_flip"] == pytest.approx(0.5) and s["max_pair"] == "B vs C"
    assert s["orderings_reachable"] == 3 and s["tied_configs"] == 1  # c3 ties A and B


# ---- properties -----------------------------------------------------------------------------
@given(paired)
def test_rho_bounded_by_ceiling(ab):
    c = sign_counts(*ab)
    assert 0 <= rho_flip(c) <= ceiling(c.n) + 1e-12


@given(paired)
def test_rho_zero_iff_d1(ab):
    c = sign_counts(*ab)
    assert (rho_flip(c) == 0) == d1(c)


@given(paired)
def test_d2_implies_d1(ab):
    c = sign_counts(*ab)
    assert (not d2(c)) or d1(c)


@given(paired)
def test_symmetry(ab):
    a, b = ab
    assert rho_flip(sign_counts(a, b)) == rho_flip(sign_counts(b, a))
    assert sign_counts(a, b).swapped() == sign_counts(b, a)


@given(paired, score)
def test_adding_a_tied_config_never_raises_rho(ab, v):
    a, b = ab
    before = rho_flip(sign_counts(a, b))
    after = rho_flip(sign_counts(a + [v], b + [v]))
    assert after <= before


@settings(max_examples=60)
@given(st.integers(1, 12).flatmap(lambda n: st.lists(st.lists(score, min_size=n, max_size=n), min_size=3, max_size=3)))
def test_orderings_reachable_bounded(cols):
    o = orderings({"a": cols[0], "b": cols[1], "c": cols[2]})
    n = len(cols[0])
    assert o["reachable"] <= min(6, n)
    assert sum(o["orders"].values()) + o["tied_configs"] == n


@settings(max_examples=60)
@given(st.integers(2, 10).flatmap(lambda n: st.lists(st.lists(st.floats(0, 1), min_size=n, max_size=n), min_size=3, max_size=3)))
def test_tau_r_in_range(cols):
    r = tau_r({"a": cols[0], "b": cols[1], "c": cols[2]})
    assert math.isnan(r["tau_r"]) or -1 - 1e-9 <= r["tau_r"] <= 1 + 1e-9
    assert r["pairs_used"] + r["pairs_undefined"] == len(cols[0]) * (len(cols[0]) - 1) // 2


@settings(max_examples=80, deadline=None)
@given(st.integers(2, 8).flatmap(lambda n: st.lists(st.lists(score, min_size=n, max_size=n), min_size=3, max_size=4)))
def test_tau_r_equals_scipy_kendall_tau_b(cols):
    """The vectorised tau_R equals the mean of scipy's tau-b over defined config pairs."""
    import itertools

    from scipy.stats import kendalltau

    mat = np.array(cols)
    ref = []
    for j, k in itertools.combinations(range(mat.shape[1]), 2):
        x, y = mat[:, j], mat[:, k]
        if np.all(x == x[0]) or np.all(y == y[0]):
            continue
        ref.append(kendalltau(x, y, variant="b").statistic)
    r = tau_r({str(i): c for i, c in enumerate(cols)})
    assert r["pairs_used"] == len(ref)
    if ref:
        assert r["tau_r"] == pytest.approx(float(np.mean(ref)), abs=1e-9)
    else:
        assert math.isnan(r["tau_r"])
