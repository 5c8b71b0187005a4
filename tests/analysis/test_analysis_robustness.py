"""Consistency, its random baseline, the cell and per-item SDs, drop rate and the regression
on hand-made items."""

import math

import numpy as np
import pandas as pd
import pytest

from analysis_synth import hand_cells, hand_meta, write_hand
from safetyrepro.analysis.robustness import (item_sd_summary, random_baseline, regression, robustness_table,
                                             write_robustness)
from safetyrepro.errors import DataError
from safetyrepro.io import read_metadata, write_parquet

C1, C2, C3 = "T1-greedy-k0-freeform", "T2-greedy-k0-freeform", "T3-t0.3-k3-freeform"
LP = "T1-greedy-k0-logprob"


def test_random_baseline_is_the_papers_p_to_the_m():
    # the paper's "33-54%" at m = 24 perturbations for models at p = 0.955-0.975
    assert round(random_baseline(0.955, 24), 2) == 0.33 and round(random_baseline(0.975, 24), 2) == 0.54
    # an XSTest unsafe prompt at p = 0.95, m = 5: 0.774, whichever correct label (not split by g)
    assert random_baseline(0.95, 5) == pytest.approx(0.7737809)
    assert random_baseline(1.0, 3) == 1.0 and random_baseline(0.0, 2) == 0.0
    for bad in [(1.5, 2), (-0.1, 2), (0.5, 0)]:
        with pytest.raises(ValueError):
            random_baseline(*bad)


def item_rows():
    """Model A on bbq (3 options, gold 'a'), seed 0 of three free-form configs:
         C1   C2    C3
    i1   a    a     a      identical, right
    i2   b    b     b      identical, wrong
    i3   a    b     a      differs
    i4   c    None  c      parse failure in C2
    consistency (right everywhere) 1/4; same answer 2/4; accuracy at the nominal C1 2/4.
    Seed 1 of the sampled C3 answers 'zzz' (wrong) everywhere."""
    labels = {C1: ["a", "b", "a", "c"], C2: ["a", "b", "b", None], C3: ["a", "b", "a", "c"]}
    rows = []
    for cfg, labs in labels.items():
        for i, lab in enumerate(labs):
            rows.append({"model": "A", "benchmark": "bbq", "config": cfg, "seed": 0, "item_id": f"i{i + 1}",
                         "parsed_label": lab, "parse_ok": lab is not None, "correct": lab == "a",
                         "stratum": "s"})
    # a second seed of the sampled config (the item SD reads it, consistency does not) and a
    # logprob config (not in the free-form row)
    for i in range(4):
        rows.append({"model": "A", "benchmark": "bbq", "config": C3, "seed": 1, "item_id": f"i{i + 1}",
                     "parsed_label": "zzz", "parse_ok": True, "correct": False, "stratum": "s"})
        rows.append({"model": "A", "benchmark": "bbq", "config": LP, "seed": 0, "item_id": f"i{i + 1}",
                     "parsed_label": "c", "parse_ok": True, "correct": False, "stratum": "s"})
    return pd.DataFrame(rows)


def cells():
    # A: nominal C1 0.6; C2 0.3; C3 0.45 -> SD 0.15, drops 0.5 and 0.25 (mean 0.375), both below
    return hand_cells([("A", "bbq", C1, 0.6), ("A", "bbq", C2, 0.3), ("A", "bbq", C3, 0.45), ("A", "bbq", LP, 0.9),
                       ("B", "bbq", C1, 0.5), ("B", "bbq", C2, 0.5), ("B", "bbq", C3, 0.6), ("B", "bbq", LP, 0.5)])


# per-item scores over (C1, C2, C3 = mean of seeds 0 and 1): i1 (1, 1, .5), i2 (0, 0, 0),
# i3 (1, 0, .5), i4 (0, 0, 0) -> sample SDs sqrt(1/12), 0, 1/2, 0
ITEM_SD_A = [math.sqrt(1 / 12), 0.0, 0.5, 0.0]


def test_robustness_row_by_hand():
    rob, sd, hist = robustness_table(cells()[lambda d: d["model"] == "A"], item_rows())
    r = rob.iloc[0]
    assert (r.model, r.benchmark, r.scoring, r.n_configs, r.n_items) == ("A", "bbq", "freeform", 3, 4)
    assert r.consistency == 0.25 and r.answer_consistency == 0.5
    # p = accuracy at the nominal config C1 (2 of 4), not pooled over the configs (5 of 12)
    assert r.performance == 0.5 and r.baseline == pytest.approx(0.125)
    assert r.consistency_over_baseline == pytest.approx(0.125)
    assert r.score_sd == pytest.approx(0.15) and r.score_mean == pytest.approx(0.45)
    assert (r.nominal_config, r.nominal_used, r.note) == (C1, C1, "")
    assert r.nominal_score == 0.6 and r.drop_rate_mean == pytest.approx(0.375)
    assert r.share_below_nominal == 1.0
    assert r.item_sd_mean == pytest.approx(np.mean(ITEM_SD_A))
    assert r.item_sd_median == pytest.approx(math.sqrt(1 / 12) / 2)
    q = sd.iloc[0]
    assert (q.n_items, q.q00, q.q100, q.share_zero) == (4, 0.0, 0.5, 0.5)
    assert q.q50 == pytest.approx(r.item_sd_median)
    # bins of 0.05 from 0 to 0.75: two items in [0, .05), sqrt(1/12) = .2887 in [.25, .3), .5 in [.5, .55)
    assert len(hist) == 15 and hist["n_items"].sum() == 4 and hist["share"].sum() == pytest.approx(1.0)
    nonzero = hist[hist["n_items"] > 0]
    assert list(zip(nonzero["bin_lo"].round(2), nonzero["n_items"])) == [(0.0, 2), (0.25, 1), (0.5, 1)]


def test_item_sd_histogram_edges():
    # the largest SD of scores in [0, 1] over 2 configs, sqrt(1/2), falls in the last bin
    row, hist = item_sd_summary("A", "bbq", pd.Series([0.0, 0.05, math.sqrt(0.5)]))
    assert hist[-1]["bin_hi"] == 0.75 and hist[-1]["n_items"] == 1 and hist[1]["n_items"] == 1
    assert row["share_zero"] == pytest.approx(1 / 3) and row["q100"] == pytest.approx(math.sqrt(0.5))
    empty, hist = item_sd_summary("A", "bbq", pd.Series([], dtype=float))
    assert empty["n_items"] == 0 and math.isnan(empty["mean"]) and all(h["n_items"] == 0 for h in hist)


def test_label_benchmark_with_two_correct_labels():
    # x0 safe (comply correct), x1 unsafe (refuse and partial correct); always right.
    # x1 answers refuse then partial: correct both times (consistent), not the identical answer
    rows = []
    for cfg, labs in {C1: ["comply", "refuse"], C2: ["comply", "partial"]}.items():
        for i, lab in enumerate(labs):
            rows.append({"model": "A", "benchmark": "xstest", "config": cfg, "seed": 0, "item_id": f"x{i}",
                         "parsed_label": lab, "parse_ok": True, "correct": True})
    c = hand_cells([("A", "xstest", C1, 1.0), ("A", "xstest", C2, 0.5)])
    r = robustness_table(c, pd.DataFrame(rows))[0].iloc[0]
    assert r.consistency == 1.0 and r.answer_consistency == 0.5
    assert r.performance == 1.0 and r.baseline == 1.0  # 1^2, not split over the two correct labels
    # drop rate relative to nominal 1.0: (1.0 - 0.5)/1.0 = 0.5, one of one below
    assert r.drop_rate_mean == pytest.approx(0.5) and r.share_below_nominal == 1.0


def crows_rows(configs, correct):
    """CrowS-Pairs item rows: ``correct[config]`` = per-item flags of p0, p1, p2, p3."""
    return pd.DataFrame([{"model": "A", "benchmark": "crows_pairs", "config": cfg, "seed": 0, "item_id": f"p{i}",
                          "parsed_label": "less" if ok else "more", "parse_ok": True, "correct": ok}
                         for cfg in configs for i, ok in enumerate(correct[cfg])])


def test_crows_pairs_row_on_its_logprob_configs_with_the_nearest_nominal():
    lp = ["T1-greedy-k0-logprob", "T2-greedy-k0-logprob", "T1-greedy-k3-logprob"]
    correct = {lp[0]: [True, True, True, False], lp[1]: [True, True, False, False], lp[2]: [True, False, True, False]}
    c = hand_cells([("A", "crows_pairs", cfg, sum(correct[cfg]) / 4) for cfg in lp])
    r = robustness_table(c, crows_rows(lp, correct))[0].iloc[0]
    assert (r.scoring, r.n_configs, r.n_items) == ("logprob", 3, 4)
    # the nominal T1-greedy-k0-freeform is not valid here: its nearest config (1 axis) stands in
    assert (r.nominal_config, r.nominal_used) == (C1, lp[0]) and "nearest valid config" in r.note
    assert r.consistency == 0.25 and r.performance == 0.75 and r.baseline == pytest.approx(0.75 ** 3)
    assert r.nominal_score == 0.75 and r.drop_rate_mean == pytest.approx((0.25 + 0.25) / 2 / 0.75)
    # two equally near configs (2 axis changes each): no reference, no p, no baseline, said so
    far = lp[1:]
    r = robustness_table(c[c["config"].isin(far)], crows_rows(far, correct))[0].iloc[0]
    assert r.nominal_used == "" and "equally near" in r.note and "missing" in r.note
    assert math.isnan(r.performance) and math.isnan(r.baseline) and math.isnan(r.drop_rate_mean)
    assert r.consistency == 0.25


def test_missing_nominal_and_zero_nominal():
    c = cells()
    # T3-t0.3-k3-freeform stands in for T3-t0.3-k5-freeform (one axis away, the only one)
    t = robustness_table(c[c["model"] == "A"], item_rows(), nominal_config="T3-t0.3-k5-freeform")[0]
    assert t.iloc[0].nominal_used == C3 and t.iloc[0].performance == 0.5  # seed 0 of C3: i1, i3 right
    # T4-greedy-k0-freeform: C1 and C2 equally near, no reference
    t = robustness_table(c[c["model"] == "A"], item_rows(), nominal_config="T4-greedy-k0-freeform")[0]
    assert math.isnan(t.iloc[0].drop_rate_mean) and "missing" in t.iloc[0].note
    assert math.isnan(t.iloc[0].baseline) and t.iloc[0].consistency == 0.25
    c.loc[(c["model"] == "A") & (c["config"] == C1), "score"] = 0.0
    t = robustness_table(c[c["model"] == "A"], item_rows())[0]
    assert math.isnan(t.iloc[0].drop_rate_mean) and t.iloc[0].share_below_nominal == 0.0
    assert "undefined" in t.iloc[0].note
    with pytest.raises(ValueError, match="analysis.nominal_config"):
        robustness_table(c[c["model"] == "A"], item_rows(), nominal_config="T1-greedy")


def test_regression_exact_line_and_degenerate():
    x = np.array([0.2, 0.4, 0.5, 0.9])
    r = regression(pd.DataFrame({"score_mean": x, "consistency": 0.1 + 0.5 * x})).iloc[0]
    assert r.slope == pytest.approx(0.5) and r.intercept == pytest.approx(0.1) and r.r2 == pytest.approx(1.0)
    assert r.n == 4
    few = regression(pd.DataFrame({"score_mean": [0.1, 0.2], "consistency": [0.3, np.nan]})).iloc[0]
    assert few.n == 1 and math.isnan(few.slope) and "fewer than 3" in few.note


def _write_inputs(tmp_path, items: pd.DataFrame):
    cs = write_hand(cells(), tmp_path / "cell_scores.parquet")
    # B's items: right in every config (fully consistent)
    b = items[items["model"] == "A"].copy()
    b["model"] = "B"
    b["parsed_label"] = "a"
    b["parse_ok"] = True
    b["correct"] = True
    ir = write_parquet(pd.concat([items, b], ignore_index=True), tmp_path / "item_results.parquet", hand_meta())
    return cs, ir


def test_write_robustness(tmp_path):
    cs, ir = _write_inputs(tmp_path, item_rows())
    paths = write_robustness(cs, ir, tmp_path / "out")
    t = pd.read_parquet(paths["robustness"]).set_index("model")
    assert t.loc["A", "consistency"] == 0.25 and t.loc["B", "consistency"] == 1.0
    assert t.loc["A", "baseline"] == pytest.approx(0.125)
    assert t.loc["B", "baseline"] == pytest.approx(1.0)  # accuracy 1 everywhere
    sd = pd.read_parquet(paths["robustness_item_sd"]).set_index("model")
    assert sd.loc["A", "mean"] == pytest.approx(np.mean(ITEM_SD_A)) and sd.loc["B", "q100"] == 0.0
    hist = pd.read_parquet(paths["robustness_item_sd_hist"])
    assert len(hist) == 2 * 15 and set(hist.groupby("model")["n_items"].sum()) == {4}
    md = read_metadata(paths["robustness"])
    assert [s["path"] for s in md["sources"]] == [str(cs), str(ir)]
    assert md["params"]["nominal_config"] == "T1-greedy-k0-freeform"
    assert read_metadata(paths["robustness_item_sd_hist"])["params"]["item_sd_bin"] == 0.05
    reg = pd.read_parquet(paths["robustness_regression"]).iloc[0]
    assert reg.n == 2 and math.isnan(reg.slope)


def test_missing_seed0_rows_name_the_cell(tmp_path):
    items = item_rows()
    cs, ir = _write_inputs(tmp_path, items[~((items["config"] == C2) & (items["model"] == "A"))])
    with pytest.raises(DataError, match=r"\(A, bbq, T2-greedy-k0-freeform\)"):
        write_robustness(cs, ir, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_duplicate_seed0_rows_are_refused():
    items = item_rows()
    dup = pd.concat([items, items[(items["config"] == C1) & (items["item_id"] == "i2")]], ignore_index=True)
    with pytest.raises(DataError, match="'i2' appears twice"):
        robustness_table(cells()[lambda d: d["model"] == "A"], dup)
