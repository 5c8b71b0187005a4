"""Consistency, its random baseline, SD, drop rate and the regression on hand-made items."""

import math

import numpy as np
import pandas as pd
import pytest

from analysis_synth import hand_cells, hand_meta, write_hand
from safetyrepro.analysis.robustness import (item_answer_space, p_same, regression, robustness_table,
                                             write_robustness)
from safetyrepro.errors import DataError
from safetyrepro.io import read_metadata, write_parquet

C1, C2, C3 = "T1-greedy-k0-freeform", "T2-greedy-k0-freeform", "T3-t0.3-k3-freeform"
LP = "T1-greedy-k0-logprob"


def test_p_same_by_hand():
    # overall performance p = 0.5, m = 3 configs, k = 3 options, one correct:
    # all right 0.5^3 = 0.125; all wrong 0.125, on the same one of the 2 wrong answers 2 * (1/2)^3 = 1/4
    assert p_same(0.5, 3, [3])[0] == pytest.approx(0.125 + 0.125 / 4)
    # k = 2: a wrong answer is the wrong answer
    assert p_same(0.5, 3, [2])[0] == pytest.approx(0.125 + 0.125)
    # XSTest unsafe prompt: comply / refuse / partial, refuse and partial correct (g = 2):
    # all right on the same correct label 0.125 * 2 * (1/2)^3 = 0.03125; all comply 0.125
    assert p_same(0.5, 3, [3], [2])[0] == pytest.approx(0.03125 + 0.125)
    # every answer correct: no wrong term
    assert p_same(0.5, 2, [2], [2])[0] == pytest.approx(0.25 * 0.5)
    assert p_same(1.0, 2, [4])[0] == 1.0 and p_same(0.0, 2, [2])[0] == 1.0
    for bad in [(0.5, 1, [1]), (1.5, 2, [2]), (0.5, 2, [3], [0]), (0.5, 2, [3], [4])]:
        with pytest.raises(ValueError):
            p_same(*bad)


def item_rows():
    """Model A on bbq (3 options, gold 'a'), seed 0 of three free-form configs:
         C1   C2    C3
    i1   a    a     a      identical, right
    i2   b    b     b      identical, wrong
    i3   a    b     a      differs
    i4   c    None  c      parse failure in C2 -> inconsistent
    consistency 2/4; accuracies C1 2/4, C2 1/4, C3 2/4."""
    labels = {C1: ["a", "b", "a", "c"], C2: ["a", "b", "b", None], C3: ["a", "b", "a", "c"]}
    rows = []
    for cfg, labs in labels.items():
        for i, lab in enumerate(labs):
            rows.append({"model": "A", "benchmark": "bbq", "config": cfg, "seed": 0, "item_id": f"i{i + 1}",
                         "parsed_label": lab, "parse_ok": lab is not None, "correct": lab == "a",
                         "stratum": "s"})
    # a second seed of the sampled config and a logprob config: both must be ignored
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


def options():
    return {"bbq": pd.DataFrame({"k": [3] * 4, "g": [1] * 4}, index=["i1", "i2", "i3", "i4"])}


# overall performance of A over C1-C3 on i1-i4: 5 right of 12 answers (not the per-config
# accuracies 2/4, 1/4, 2/4 one by one): baseline (5/12)^3 + (7/12)^3 / 4 = 210.75 / 1728
BASELINE_A = (5 / 12) ** 3 + (7 / 12) ** 3 / 4


def test_robustness_row_by_hand():
    items = item_rows()
    items = items[items["seed"] == 0]
    t = robustness_table(cells()[lambda d: d["model"] == "A"], items, options())
    r = t.iloc[0]
    assert (r.model, r.benchmark, r.n_configs, r.n_items) == ("A", "bbq", 3, 4)
    assert r.consistency == 0.5 and r.performance == pytest.approx(5 / 12)
    assert r.baseline == pytest.approx(BASELINE_A) and r.baseline == pytest.approx(210.75 / 1728)
    assert r.score_sd == pytest.approx(0.15) and r.score_mean == pytest.approx(0.45)
    assert r.nominal_score == 0.6 and r.drop_rate_mean == pytest.approx(0.375)
    assert r.share_below_nominal == 1.0


def test_label_benchmark_with_two_correct_labels(tmp_path):
    # x0 safe (comply correct), x1 unsafe (refuse and partial correct); always right -> p = 1.
    # x1 answers refuse then partial: right both times, yet not the identical answer
    rows = []
    for cfg, labs in {C1: ["comply", "refuse"], C2: ["comply", "partial"]}.items():
        for i, lab in enumerate(labs):
            rows.append({"model": "A", "benchmark": "xstest", "config": cfg, "seed": 0, "item_id": f"x{i}",
                         "parsed_label": lab, "parse_ok": True, "correct": True})
    write_parquet(pd.DataFrame({"item_id": ["x0", "x1"], "choices": [[], []], "label": ["safe", "unsafe"]}),
                  tmp_path / "xstest.parquet", {"subset_hash": "x"})
    space = item_answer_space(tmp_path, "xstest")
    assert space.loc["x0"].tolist() == [3, 1] and space.loc["x1"].tolist() == [3, 2]
    c = hand_cells([("A", "xstest", C1, 1.0), ("A", "xstest", C2, 0.5)])
    t = robustness_table(c, pd.DataFrame(rows), {"xstest": space})
    # p = 1, m = 2: x0 1 * 1^-1 = 1; x1 1 * 2^-1 = 1/2 -> baseline 3/4; consistency x0 yes, x1 no
    assert t.iloc[0].baseline == pytest.approx(0.75) and t.iloc[0].consistency == 0.5
    # drop rate relative to nominal 1.0: (1.0 - 0.5)/1.0 = 0.5, one of one below
    assert t.iloc[0].drop_rate_mean == pytest.approx(0.5) and t.iloc[0].share_below_nominal == 1.0
    # toxigen: yes / no, one correct
    write_parquet(pd.DataFrame({"item_id": ["t0"], "choices": [[]], "label": ["toxic"]}),
                  tmp_path / "toxigen.parquet", {"subset_hash": "x"})
    assert item_answer_space(tmp_path, "toxigen").loc["t0"].tolist() == [2, 1]
    write_parquet(pd.DataFrame({"item_id": ["t0"], "choices": [[]], "label": ["weird"]}),
                  tmp_path / "toxigen.parquet", {"subset_hash": "x"})
    with pytest.raises(DataError, match="gold_map"):
        item_answer_space(tmp_path, "toxigen")


def test_missing_nominal_and_zero_nominal():
    items = item_rows()
    items = items[items["seed"] == 0]
    c = cells()
    t = robustness_table(c[c["model"] == "A"], items, options(), nominal_config="T4-greedy-k0-freeform")
    assert math.isnan(t.iloc[0].drop_rate_mean) and "missing" in t.iloc[0].note
    c.loc[(c["model"] == "A") & (c["config"] == C1), "score"] = 0.0
    t = robustness_table(c[c["model"] == "A"], items, options())
    assert math.isnan(t.iloc[0].drop_rate_mean) and t.iloc[0].share_below_nominal == 0.0
    assert "undefined" in t.iloc[0].note


def test_regression_exact_line_and_degenerate():
    x = np.array([0.2, 0.4, 0.5, 0.9])
    r = regression(pd.DataFrame({"score_mean": x, "consistency": 0.1 + 0.5 * x})).iloc[0]
    assert r.slope == pytest.approx(0.5) and r.intercept == pytest.approx(0.1) and r.r2 == pytest.approx(1.0)
    assert r.n == 4
    few = regression(pd.DataFrame({"score_mean": [0.1, 0.2], "consistency": [0.3, np.nan]})).iloc[0]
    assert few.n == 1 and math.isnan(few.slope) and "fewer than 3" in few.note


def _write_inputs(tmp_path, items: pd.DataFrame):
    cs = write_hand(cells(), tmp_path / "cell_scores.parquet")
    # B's items: same answers as A in every config (fully consistent)
    b = items[items["model"] == "A"].copy()
    b["model"] = "B"
    b["parsed_label"] = "a"
    b["parse_ok"] = True
    b["correct"] = True
    ir = write_parquet(pd.concat([items, b], ignore_index=True), tmp_path / "item_results.parquet", hand_meta())
    it = pd.DataFrame({"item_id": ["i1", "i2", "i3", "i4"], "choices": [["a", "b", "c"]] * 4})
    write_parquet(it, tmp_path / "items" / "bbq.parquet", {"subset_hash": "subset-bbq"})
    return cs, ir


def test_write_robustness(tmp_path):
    cs, ir = _write_inputs(tmp_path, item_rows())
    paths = write_robustness(cs, ir, tmp_path / "out", items_dir=tmp_path / "items")
    t = pd.read_parquet(paths["robustness"]).set_index("model")
    assert t.loc["A", "consistency"] == 0.5 and t.loc["B", "consistency"] == 1.0
    assert t.loc["A", "baseline"] == pytest.approx(BASELINE_A)
    assert t.loc["B", "baseline"] == pytest.approx(1.0)  # accuracy 1 everywhere
    md = read_metadata(paths["robustness"])
    assert [s["path"] for s in md["sources"]] == [str(cs), str(ir)]
    assert md["params"]["nominal_config"] == "T1-greedy-k0-freeform"
    reg = pd.read_parquet(paths["robustness_regression"]).iloc[0]
    assert reg.n == 2 and math.isnan(reg.slope)


def test_missing_seed0_rows_name_the_cell(tmp_path):
    items = item_rows()
    cs, ir = _write_inputs(tmp_path, items[~((items["config"] == C2) & (items["model"] == "A"))])
    with pytest.raises(DataError, match=r"\(A, bbq, T2-greedy-k0-freeform\)"):
        write_robustness(cs, ir, tmp_path / "out", items_dir=tmp_path / "items")
    assert not (tmp_path / "out").exists()


def test_item_not_in_item_table(tmp_path):
    items = item_rows()
    items.loc[items["item_id"] == "i4", "item_id"] = "i99"
    cs, ir = _write_inputs(tmp_path, items)
    with pytest.raises(DataError, match="i99"):
        write_robustness(cs, ir, tmp_path / "out", items_dir=tmp_path / "items")
