"""Item-level significance (metrics.significance) pinned on hand-computed cases: Holm, the
exact McNemar test, a pair whose reversals are all within item noise, a pair with significant
reversals both ways, a one-sided pair, and certify on item-level and config-level input."""

import json

import numpy as np
import pandas as pd
import pytest

from conftest import run_cli
from safetyrepro.metrics.significance import (analyse_grid, draw_weights, holm, item_grid_from_scores,
                                              mcnemar_exact)


def test_holm_hand_computed():
    # sorted p: 0.01, 0.03125, 0.25, 1 -> 4*0.01, max(0.04, 3*0.03125), max(.., 2*0.25), 1
    got = holm(np.array([0.25, 0.01, 1.0, 0.03125]))
    assert got.tolist() == pytest.approx([0.5, 0.04, 1.0, 0.09375])


def test_mcnemar_exact_hand_computed():
    # n10 = 6, n01 = 0: 2 * 0.5^6; n10 = 3, n01 = 1: 2 * (1 + 4) / 16; no discordant items: 1
    assert mcnemar_exact(np.array([6, 3, 0]), np.array([0, 1, 0])).tolist() == pytest.approx([2 / 64, 10 / 16, 1.0])


def _items(spec: dict, n: int) -> pd.DataFrame:
    """spec: config -> (item scores of A, item scores of B) as functions of the item index."""
    rows = []
    for c, (fa, fb) in spec.items():
        for i in range(n):
            rows += [("A", c, f"i{i:02d}", fa(i)), ("B", c, f"i{i:02d}", fb(i))]
    return pd.DataFrame(rows, columns=["model", "config", "item", "score"])


def test_pair_with_only_within_noise_reversals():
    # 20 items, 0/1: c1 A 11 vs B 10 (one discordant item: McNemar p = 1), c2 the mirror, c3 tie
    spec = {"c1": (lambda i: float(i < 11), lambda i: float(i < 10)),
            "c2": (lambda i: float(i < 10), lambda i: float(i < 11)),
            "c3": (lambda i: float(i < 7), lambda i: float(i < 7))}
    g = item_grid_from_scores(_items(spec, 20), "bbq")
    pairs, cfgs, boot = analyse_grid(g, alpha=0.05, samples=1000, seed=0)
    p = pairs[0]
    assert (p["n_plus"], p["n_minus"], p["n_zero"]) == (1, 1, 1) and p["rho_flip"] == pytest.approx(1 / 3)
    assert (p["n_plus_sig"], p["n_minus_sig"], p["rho_flip_sig"]) == (0, 0, 0.0)
    assert p["pattern"] == "noise" and not p["crossover"] and p["crossover_p"] > 0.05
    by = {r["config"]: r for r in cfgs}
    assert by["c1"]["test"] == "mcnemar_exact" and by["c1"]["p_value"] == 1.0
    assert by["c1"]["diff"] == pytest.approx(0.05) and by["c3"]["test"] == "none (tie)"
    # se of d = (1, 0 x 19): sd = sqrt(1/20) ... ddof 1: sqrt((1 - 1/20)/19) = sqrt(1/20); / sqrt(20)
    assert by["c1"]["se"] == pytest.approx(np.sqrt(1 / 20) / np.sqrt(20))
    # item bootstrap: the discordant items of c1/c2 are missed in many draws, so the interval reaches 0
    b = boot[0]
    assert b["resamples"] == "items" and b["ci_low"] == 0.0 and b["estimate"] == pytest.approx(1 / 3)


def test_pair_with_significant_reversals_both_ways():
    # 40 items: c1 A right on 30, B on 5 of those (n10 = 25, n01 = 0); c2 the mirror; c3 seed means
    # (k/5) with A ahead by 0.1 on half the items, B equal otherwise -> paired bootstrap
    spec = {"c1": (lambda i: float(i < 30), lambda i: float(i < 5)),
            "c2": (lambda i: float(i < 5), lambda i: float(i < 30)),
            "c3": (lambda i: 0.6 if i % 2 else 0.4, lambda i: 0.4)}
    g = item_grid_from_scores(_items(spec, 40), "bbq")
    assert g.exact and int(g.den[0, 0]) == 5          # 0.4 and 0.6 recovered as 2/5, 3/5
    pairs, cfgs, _ = analyse_grid(g, alpha=0.05, samples=1000, seed=0)
    by = {r["config"]: r for r in cfgs}
    p_mc = 2 * 0.5 ** 25
    assert by["c1"]["p_value"] == pytest.approx(p_mc) and by["c2"]["p_value"] == pytest.approx(p_mc)
    # Holm over 3 configs: the two smallest are 3 * p_mc; c3's bootstrap p is the floor 1/1001
    assert by["c3"]["test"] == "paired_bootstrap" and by["c3"]["p_value"] == pytest.approx(1 / 1001)
    assert by["c1"]["p_holm"] == pytest.approx(3 * p_mc) and by["c3"]["p_holm"] == pytest.approx(1 / 1001)
    assert (by["c1"]["ahead"], by["c2"]["ahead"], by["c3"]["ahead"]) == ("A", "B", "A")
    p = pairs[0]
    assert (p["n_plus_sig"], p["n_minus_sig"]) == (2, 1) and p["rho_flip_sig"] == pytest.approx(1 / 3)
    assert p["pattern"] == "crossover" and p["crossover"] and p["crossover_p"] == pytest.approx(1 / 1001)
    assert p["crit_a"] > 0 and p["crit_b"] > 0


def test_one_sided_pair_and_alpha_matters():
    # A far ahead on c1 (n10 = 12), B ahead by one item on c2
    spec = {"c1": (lambda i: float(i < 14), lambda i: float(i < 2)),
            "c2": (lambda i: float(i < 3), lambda i: float(i < 4))}
    g = item_grid_from_scores(_items(spec, 20), "toxigen")
    p = analyse_grid(g, alpha=0.05, samples=500, seed=1)[0][0]
    assert (p["n_plus_sig"], p["n_minus_sig"], p["pattern"]) == (1, 0, "one_sided")
    assert p["p_a_ahead"] <= 0.05 < p["p_b_ahead"] and not p["crossover"]
    # alpha is a real parameter: at 1e-4 the Holm p of c1 (2 * 2 * 0.5^12 = 9.8e-4) is not enough
    p = analyse_grid(g, alpha=1e-4, samples=500, seed=1)[0][0]
    assert p["n_plus_sig"] == 0 and p["pattern"] == "noise"


def test_bootstrap_draws_are_seeded_per_benchmark():
    a = draw_weights(30, 50, seed=4, benchmark="bbq")
    assert (a.sum(axis=1) == 30).all() and np.array_equal(a, draw_weights(30, 50, seed=4, benchmark="bbq"))
    assert not np.array_equal(a, draw_weights(30, 50, seed=4, benchmark="xstest"))


def test_missing_item_is_named():
    df = _items({"c1": (lambda i: 1.0, lambda i: 0.0)}, 5)
    df = df[~((df["model"] == "B") & (df["item"] == "i03"))]
    with pytest.raises(ValueError, match="'B' has no score for item 'i03' on config 'c1'"):
        item_grid_from_scores(df, "bbq")


def _write_item_table(path, with_example: bool = True):
    """Item-level long table: bbq as the both-ways case; xstest holds the issue's tie: 12 items
    whose 5-seed means sum to 28/60 for both models, laid out differently over items."""
    spec = {"c1": (lambda i: float(i < 30), lambda i: float(i < 5)),
            "c2": (lambda i: float(i < 5), lambda i: float(i < 30))}
    df = _items(spec, 40).assign(benchmark="bbq")
    ka = [5, 5, 5, 4, 3, 2, 1, 1, 1, 1, 0, 0]    # 28 correct of 60 (12 items x 5 seeds)
    kb = [5, 5, 4, 4, 3, 3, 2, 1, 1, 0, 0, 0]    # 28 as well
    assert sum(ka) == sum(kb) == 28
    rows = [("A", "c1", f"x{i:02d}", ka[i] / 5) for i in range(12)] + \
           [("B", "c1", f"x{i:02d}", kb[i] / 5) for i in range(12)] + \
           [("A", "c2", f"x{i:02d}", 1.0) for i in range(12)] + [("B", "c2", f"x{i:02d}", 0.0) for i in range(12)]
    x = pd.DataFrame(rows, columns=["model", "config", "item", "score"]).assign(benchmark="xstest")
    pd.concat([df, x])[["model", "benchmark", "config", "item", "score"]].to_csv(path, index=False,
                                                                                  float_format="%.17g")


def test_certify_item_level_reports_significance(tmp_path):
    p = tmp_path / "items.csv"
    _write_item_table(p)
    r = run_cli("certify", str(p), "--json", "--bootstrap-samples", "300", "--bootstrap-seed", "2",
                "--out", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["level"] == "item" and j["tie_rule"]["kind"] == "exact"
    pairs = {x["benchmark"]: x for x in j["pairs"]}
    assert (pairs["xstest"]["n_plus"], pairs["xstest"]["n_zero"]) == (1, 1)   # 28/60 vs 28/60 ties
    sig = {x["benchmark"]: x for x in j["significance"]["significance"]}
    assert sig["bbq"]["pattern"] == "crossover" and sig["bbq"]["rho_flip_sig"] == 0.5
    assert sig["xstest"]["pattern"] == "stable" and sig["xstest"]["n_plus_sig"] == 1
    cfg = [x for x in j["significance"]["significance_configs"] if x["benchmark"] == "xstest"]
    assert {x["config"]: x["test"] for x in cfg} == {"c1": "none (tie)", "c2": "mcnemar_exact"}
    boot = j["significance"]["bootstrap_items"]
    assert {x["resamples"] for x in boot} == {"items"} and len(boot) == 4
    assert (tmp_path / "out" / "significance.csv").exists()
    t = run_cli("certify", str(p), "--bootstrap-samples", "100")
    assert "rho_flip_sig" in t.stdout and "crossover" in t.stdout and "resampling items" in t.stdout


def test_certify_config_level_says_significance_needs_items(tmp_path):
    p = tmp_path / "cells.csv"
    pd.DataFrame([("A", "bbq", "c1", 0.5), ("B", "bbq", "c1", 0.4)],
                 columns=["model", "benchmark", "config", "score"]).to_csv(p, index=False)
    j = json.loads(run_cli("certify", str(p), "--json").stdout)
    assert j["level"] == "config" and j["significance"] is None and "item" in j["significance_note"]
    assert "needs item-level input" in run_cli("certify", str(p)).stdout


def test_tolerance_reaches_the_item_level_signs():
    spec = {"c1": (lambda i: float(i < 11), lambda i: float(i < 10)),
            "c2": (lambda i: float(i < 15), lambda i: float(i < 5))}
    g = item_grid_from_scores(_items(spec, 20), "bbq")
    pairs, cfgs, _ = analyse_grid(g, samples=200, seed=0, tol=0.1)
    assert [r["test"] for r in cfgs] == ["none (tie)", "mcnemar_exact"]       # |0.05| <= 0.1 ties
    assert (pairs[0]["n_plus"], pairs[0]["n_zero"], pairs[0]["tie_rule"]) == (1, 1, "absolute")
