"""Item-level verdicts (metrics.significance) on cases with known answers: Holm and McNemar by
hand, the exact sign-flip test equal to McNemar on 0/1 items, pairs within noise, a real
crossover, zero-spread items, identical models, resolution, families, power, the decimal
tolerance, and certify on item-level and config-level input."""

import json

import numpy as np
import pandas as pd
import pytest

from conftest import run_cli
from safetyrepro.metrics import orderings, order_change_rate
from safetyrepro.metrics.compare import Scores
from safetyrepro.metrics.significance import (Settings, analyse_grid, draw_weights, holm, item_grid_from_scores,
                                              mcnemar_exact, significance_tables)


def test_holm_hand_computed():
    # sorted p: 0.01, 0.03125, 0.25, 1 -> 4*0.01, max(0.04, 3*0.03125), max(.., 2*0.25), 1
    got = holm(np.array([0.25, 0.01, 1.0, 0.03125]))
    assert got.tolist() == pytest.approx([0.5, 0.04, 1.0, 0.09375])


def test_mcnemar_exact_hand_computed():
    # n10 = 6, n01 = 0: 2 * 0.5^6; n10 = 3, n01 = 1: 2 * (1 + 4) / 16; no discordant items: 1
    assert mcnemar_exact(np.array([6, 3, 0]), np.array([0, 1, 0])).tolist() == pytest.approx([2 / 64, 10 / 16, 1.0])


def _items(spec: dict, n: int, models=("A", "B")) -> pd.DataFrame:
    """spec: config -> item-score functions of the item index, one per model."""
    rows = []
    for c, fs in spec.items():
        for i in range(n):
            rows += [(m, c, f"i{i:03d}", f(i)) for m, f in zip(models, fs)]
    return pd.DataFrame(rows, columns=["model", "config", "item", "score"])


def _rows(out: dict) -> tuple[dict, dict, dict]:
    return (out["significance"].to_dict("records")[0], {r["config"]: r for r in out["significance_configs"].to_dict("records")},
            out["significance_benchmarks"].to_dict("records")[0])


@pytest.mark.parametrize("n10,n01", [(6, 0), (3, 1), (5, 5), (7, 2), (1, 0)])
def test_exact_sign_flip_is_mcnemar_on_binary_items(n10, n01):
    n = 14
    a = [1.0] * n10 + [0.0] * n01 + [1.0] * 2 + [0.0] * (n - n10 - n01 - 2)
    b = [0.0] * n10 + [1.0] * n01 + [1.0] * 2 + [0.0] * (n - n10 - n01 - 2)
    g = item_grid_from_scores(_items({"c1": (lambda i: a[i], lambda i: b[i])}, n), "bbq")
    _, by, _ = _rows(analyse_grid(g))
    r = by["c1"]
    if n10 == n01:
        assert r["test"] == "none (tie)" and r["p_value"] == 1.0
    else:
        assert r["test"].startswith("sign_flip_exact") and "McNemar" in r["test"]
        assert r["p_value"] == pytest.approx(float(mcnemar_exact(np.array([n10]), np.array([n01]))[0]))


def test_pair_within_noise():
    # 20 items, 0/1: c1 A 11 vs B 10 (one discordant item), c2 the mirror, c3 tie
    spec = {"c1": (lambda i: float(i < 11), lambda i: float(i < 10)),
            "c2": (lambda i: float(i < 10), lambda i: float(i < 11)),
            "c3": (lambda i: float(i < 7), lambda i: float(i < 7))}
    g = item_grid_from_scores(_items(spec, 20), "bbq")
    p, by, bench = _rows(analyse_grid(g))
    assert (p["n_plus"], p["n_minus"], p["n_zero"]) == (1, 1, 1) and p["rho_flip"] == pytest.approx(1 / 3)
    assert (p["n_plus_sig"], p["n_minus_sig"], p["pattern"]) == (0, 0, "noise") and not p["crossover"]
    # one item differs: both of its flips give the same rho_flip, so the flips are exactly noise
    assert p["resampling"].startswith("exact: all 2 sign flips") and p["rho_flip_null_p"] == 1.0
    assert by["c1"]["p_value"] == 1.0 and by["c3"]["test"] == "none (tie)" and by["c1"]["diff"] == pytest.approx(0.05)
    assert bench["verdict"] == "noise"


def test_real_crossover_found_and_decisions_agree():
    # 40 items: c1 A right on 30, B on 5 of those (25 discordant); c2 the mirror; c3 seed means k/5
    spec = {"c1": (lambda i: float(i < 30), lambda i: float(i < 5)),
            "c2": (lambda i: float(i < 5), lambda i: float(i < 30)),
            "c3": (lambda i: 0.6 if i % 2 else 0.4, lambda i: 0.4)}
    g = item_grid_from_scores(_items(spec, 40), "bbq")
    assert g.exact and int(g.den[0, 0]) == 5
    p, by, bench = _rows(analyse_grid(g))
    assert (by["c1"]["ahead"], by["c2"]["ahead"], by["c3"]["ahead"]) == ("A", "B", "A")
    assert p["pattern"] == "crossover" and p["crossover"] and bench["verdict"] == "crossover"
    # the crossover decision is the per-config decisions: both directions have a significant config
    assert p["crossover_p"] == max(p["p_a_ahead"], p["p_b_ahead"]) <= 0.05
    assert p["p_a_ahead"] == min(by["c1"]["p_adj"], by["c3"]["p_adj"]) and p["p_b_ahead"] == by["c2"]["p_adj"]
    # step-down max-T never adjusts below the raw p
    assert all(r["p_adj"] >= r["p_value"] for r in by.values())


def test_two_items_without_spread_never_make_a_crossover():
    spec = {"c1": (lambda i: 1.0, lambda i: 0.0), "c2": (lambda i: 0.0, lambda i: 1.0)}
    p, by, _ = _rows(analyse_grid(item_grid_from_scores(_items(spec, 2), "bbq")))
    assert not p["crossover"] and p["crossover_p"] == 0.5 and by["c1"]["p_value"] == 0.5
    assert p["min_attainable_p"] == 0.5 and not p["can_reach_alpha"] and not by["c1"]["detectable"]


def _null_grid(rng, n_models: int, n_configs: int, n: int, seeds: int = 1, effect=None):
    """Identical models: every model draws item outcomes from the same per-(config, item) p."""
    p = rng.uniform(0.2, 0.8, size=(n_configs, n))
    num = []
    for m in range(n_models):
        pm = p if effect is None else np.clip(p + effect[m][:, None], 0, 1)
        num.append(rng.binomial(seeds, pm))
    num = np.stack(num).astype(np.int64)
    den = np.full((n_models, n_configs), seeds, dtype=np.int64)
    from safetyrepro.metrics.itemgrid import ItemGrid

    return ItemGrid("b", [f"m{k}" for k in range(n_models)], [f"c{c:03d}" for c in range(n_configs)],
                    [f"i{i:03d}" for i in range(n)], num / den[:, :, None], num, den)


@pytest.mark.slow
@pytest.mark.parametrize("n,seeds,reps,samples", [(3, 5, 200, None), (12, 1, 200, None), (300, 1, 60, 400)])
def test_null_tables_keep_the_family_wise_size(n, seeds, reps, samples):
    """48 configs, identical models: at least one significant config (and a crossover) in at most
    alpha + 3 Monte-Carlo SE of the tables; rho_flip_null_p is no smaller than uniform."""
    rng = np.random.default_rng(20261204 + n)
    fw = cross = small_p = 0
    for _ in range(reps):
        out = significance_tables([_null_grid(rng, 2, 48, n, seeds)], Settings(samples=samples))
        r = out["significance"].iloc[0]
        fw += (r["n_plus_sig"] + r["n_minus_sig"]) > 0
        cross += bool(r["crossover"])
        small_p += r["rho_flip_null_p"] <= 0.05
    bound = 0.05 + 3 * np.sqrt(0.05 * 0.95 / reps)
    assert fw / reps <= bound and cross / reps <= bound and small_p / reps <= bound


def test_identical_models_read_as_noise_and_a_seed_mean_crossover_reaches_significance():
    rng = np.random.default_rng(5)
    # two identical models (the 48 configs x 300 binary items), and three read as one
    # family per benchmark (every pair and config)
    for models, family in ((2, "pair"), (3, "benchmark")):
        g = _null_grid(rng, models, 48, 300)
        out = significance_tables([g], Settings(family=family))
        sig, bench = out["significance"], out["significance_benchmarks"].iloc[0]
        assert (sig["rho_flip"] > 0.25).all()                          # raw rho_flip is large ...
        assert (sig["rho_flip_null_p"] > 0.05).all() and not sig["crossover"].any()   # ... and noise
        # a lone false positive is allowed at the family-wise 5% (the size test above bounds how often)
        assert (sig["n_plus_sig"] + sig["n_minus_sig"]).sum() <= 1 and bench["verdict"] == "noise"
        assert bench["max_rho_flip_null_p"] > 0.05 and bench["orderings_null_p"] > 0.05
    # 60 configs of 5-seed means, +-35 pp each way: significant both ways at default settings
    eff = np.where(np.arange(60) % 2 == 0, 0.35, -0.35)
    g2 = _null_grid(rng, 2, 60, 50, seeds=5, effect=[eff / 2, -eff / 2])
    p = significance_tables([g2], Settings())["significance"].iloc[0]
    assert p["crossover"] and p["n_plus_sig"] > 20 and p["n_minus_sig"] > 20 and p["can_reach_alpha"]


def test_benchmark_noise_references_use_the_metric_definitions():
    rng = np.random.default_rng(9)
    g = _null_grid(rng, 3, 20, 30)
    bench = analyse_grid(g, samples=300)["significance_benchmarks"].iloc[0]
    cells = g.cell_scores()
    cols = {m: Scores(num=cells.num[i], den=cells.den[i]) for i, m in enumerate(g.models)}
    assert bench["orderings_reachable"] == orderings(cols)["reachable"]
    assert bench["order_change_rate"] == pytest.approx(order_change_rate(cols)["order_change_rate"])
    assert bench["order_change_exchangeable"] == pytest.approx(5 / 6)


def test_a_user_sample_count_that_cannot_reach_alpha_is_named():
    rng = np.random.default_rng(3)
    g = _null_grid(rng, 2, 60, 300)
    warn: list[str] = []
    out = significance_tables([g], Settings(samples=1000, correction="holm"), table="table_x", warnings=warn)
    r = out["significance"].iloc[0]
    assert r["min_attainable_p"] == pytest.approx(60 / 1001) and not r["can_reach_alpha"]
    assert len(warn) == 1 and warn[0].startswith("table_x:") and "raise the resampling samples" in warn[0]
    # the default count is chosen so Holm over 60 configs can reach alpha / 20
    r = significance_tables([g], Settings(correction="holm"))["significance"].iloc[0]
    assert r["samples"] >= 24000 and r["min_attainable_p"] <= 0.05 / 20


def test_wider_families_are_at_least_as_strict():
    rng = np.random.default_rng(11)
    eff = np.where(np.arange(24) < 6, 0.25, 0.0)
    g = _null_grid(rng, 3, 24, 80, effect=[eff, np.zeros(24), -eff])
    counts = {}
    for fam in ("pair", "benchmark", "table"):
        sig = significance_tables([g], Settings(family=fam))["significance"]
        counts[fam] = int((sig["n_plus_sig"] + sig["n_minus_sig"]).sum())
        assert set(sig["family"]) == {fam}
    assert counts["pair"] >= counts["benchmark"] > 0


def test_power_is_stated():
    rng = np.random.default_rng(2)
    few = analyse_grid(_null_grid(rng, 2, 48, 3, seeds=5))["significance_configs"]
    assert np.isinf(few["mdd"]).all() and not few["detectable"].any()
    m50 = analyse_grid(_null_grid(rng, 2, 48, 50))["significance_configs"]["mdd"].median()
    m300 = analyse_grid(_null_grid(rng, 2, 48, 300))["significance_configs"]["mdd"].median()
    assert 0 < m300 < m50 < 1


def test_bootstrap_draws_are_seeded_per_benchmark():
    a = draw_weights(30, 50, seed=4, benchmark="bbq")
    assert (a.sum(axis=1) == 30).all() and np.array_equal(a, draw_weights(30, 50, seed=4, benchmark="bbq"))
    assert not np.array_equal(a, draw_weights(30, 50, seed=4, benchmark="xstest"))


def test_missing_item_is_named():
    df = _items({"c1": (lambda i: 1.0, lambda i: 0.0)}, 5)
    df = df[~((df["model"] == "B") & (df["item"] == "i003"))]
    with pytest.raises(ValueError, match="'B' has no score for item 'i003' on config 'c1'"):
        item_grid_from_scores(df, "bbq")


def _write_item_table(path):
    """bbq as the both-ways case; xstest holds a tie: 12 items whose 5-seed means sum to 28/60
    for both models, laid out differently over items."""
    spec = {"c1": (lambda i: float(i < 30), lambda i: float(i < 5)),
            "c2": (lambda i: float(i < 5), lambda i: float(i < 30))}
    df = _items(spec, 40).assign(benchmark="bbq")
    ka = [5, 5, 5, 4, 3, 2, 1, 1, 1, 1, 0, 0]
    kb = [5, 5, 4, 4, 3, 3, 2, 1, 1, 0, 0, 0]
    assert sum(ka) == sum(kb) == 28
    rows = [("A", "c1", f"x{i:02d}", ka[i] / 5) for i in range(12)] + \
           [("B", "c1", f"x{i:02d}", kb[i] / 5) for i in range(12)] + \
           [("A", "c2", f"x{i:02d}", 1.0) for i in range(12)] + [("B", "c2", f"x{i:02d}", 0.0) for i in range(12)]
    x = pd.DataFrame(rows, columns=["model", "config", "item", "score"]).assign(benchmark="xstest")
    pd.concat([df, x])[["model", "benchmark", "config", "item", "score"]].to_csv(path, index=False,
                                                                                  float_format="%.17g")


def test_certify_item_level_reports_verdicts_against_noise(tmp_path):
    p = tmp_path / "items.csv"
    _write_item_table(p)
    r = run_cli("certify", str(p), "--json", "--seed", "2", "--out", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["level"] == "item" and j["tie_rule"]["kind"] == "exact"
    pairs = {x["benchmark"]: x for x in j["pairs"]}
    assert (pairs["xstest"]["n_plus"], pairs["xstest"]["n_zero"]) == (1, 1)   # 28/60 vs 28/60 ties
    sig = {x["benchmark"]: x for x in j["significance"]["significance"]}
    assert sig["bbq"]["pattern"] == "crossover" and sig["bbq"]["rho_flip_sig"] == 0.5
    assert sig["xstest"]["pattern"] == "stable" and sig["xstest"]["n_plus_sig"] == 1
    assert {"rho_flip_null_mean", "rho_flip_null_q95", "rho_flip_null_p"} <= set(sig["bbq"])
    bench = {x["benchmark"]: x for x in j["significance"]["significance_benchmarks"]}
    assert bench["bbq"]["verdict"] == "crossover" and bench["xstest"]["verdict"] == "stable"
    boot = j["significance"]["bootstrap_items"]
    assert {x["resamples"] for x in boot} == {"items"} and "not a confidence interval" in boot[0]["reading"]
    assert (tmp_path / "out" / "significance_benchmarks.csv").exists()
    t = run_cli("certify", str(p))
    head = t.stdout.split("\n\n")[0]
    assert "Verdicts read against noise" in head and "bbq: max rho_flip 0.500" in head
    assert "reversals beyond item noise" in head


def test_certify_config_level_says_significance_needs_items(tmp_path):
    p = tmp_path / "cells.csv"
    pd.DataFrame([("A", "bbq", "c1", 0.5), ("B", "bbq", "c1", 0.4)],
                 columns=["model", "benchmark", "config", "score"]).to_csv(p, index=False)
    j = json.loads(run_cli("certify", str(p), "--json").stdout)
    assert j["level"] == "config" and j["significance"] is None and "item" in j["significance_note"]
    assert "need item-level input" in run_cli("certify", str(p)).stdout


def test_tolerance_is_decided_in_decimal_at_both_levels(tmp_path):
    """--tol 0.1 ties every 0.1 gap (0.8 vs 0.7, 0.7 vs 0.6, 0.3 vs 0.2), config level and item level."""
    gaps = [(0.8, 0.7), (0.7, 0.6), (0.3, 0.2), (0.9, 0.75)]
    cfg = pd.DataFrame([(m, "bbq", f"c{k}", s) for k, (a, b) in enumerate(gaps) for m, s in (("A", a), ("B", b))],
                       columns=["model", "benchmark", "config", "score"])
    cfg.to_csv(tmp_path / "cfg.csv", index=False)
    items = _items({f"c{k}": (lambda i, a=a: float(i < round(a * 20)), lambda i, b=b: float(i < round(b * 20)))
                    for k, (a, b) in enumerate(gaps)}, 20).assign(benchmark="bbq")
    items.to_csv(tmp_path / "items.csv", index=False)
    for f in ("cfg.csv", "items.csv"):
        j = json.loads(run_cli("certify", str(tmp_path / f), "--tol", "0.1", "--json").stdout)
        pr = j["pairs"][0]
        assert (pr["n_plus"], pr["n_zero"], pr["tie_rule"]) == (1, 3, "absolute"), f
    g = item_grid_from_scores(items, "bbq")
    by = _rows(analyse_grid(g, tol=0.1))[1]
    assert [by[f"c{k}"]["test"] for k in range(3)] == ["none (tie)"] * 3 and by["c3"]["test"] != "none (tie)"
