"""The nearest reversing configuration and the total-order change rate on hand-made grids
(distances and configs worked out in the comments), through the metric core, the paper
tables' CLI path, the GRID cards and `certify --nominal`."""

import json
import math

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from analysis_synth import hand_cells, provenance_for, write_hand
from safetyrepro.analysis.cards import build_cards, card_markdown
from safetyrepro.analysis.tables import nearest_reversal, tau_r_table
from safetyrepro.certify import certify
from safetyrepro.cli import app
from safetyrepro.errors import DataError
from safetyrepro.io import read_metadata
from safetyrepro.metrics import order_change_rate
from safetyrepro.metrics.reversal import NONE_TEXT, NO_SIG_TEXT, changed_axes, nearest_reversal_table

NOM = "T1-greedy-k0-freeform"
#                                    A     B     C      axes changed from NOM
GRID = {NOM:                      (0.60, 0.50, 0.50),  # -         A > B; A > C; B = C
        "T2-greedy-k0-freeform":  (0.70, 0.40, 0.40),  # template  A > B
        "T1-greedy-k3-freeform":  (0.50, 0.50, 0.40),  # shots     A = B (a tie is no reversal)
        "T1-greedy-k0-logprob":   (0.80, 0.30, 0.20),  # scoring   A > B
        "T2-greedy-k3-freeform":  (0.40, 0.60, 0.30),  # template+shots     B > A  <- distance 2
        "T2-greedy-k0-logprob":   (0.30, 0.50, 0.25),  # template+scoring   B > A  <- distance 2
        "T3-t0.7-k5-freeform":    (0.20, 0.90, 0.10)}  # 3 axes             B > A
# A vs B: nominal A ahead; reversals at distance 2 (two configs) and 3 -> distance 2.
# A vs C: A ahead or tied everywhere... A >= C in every config -> "none within the envelope".
# B vs C: tied at the nominal -> no verdict to reverse.
# crows_pairs (logprob only): the nominal is not in its envelope; T1-greedy-k0-logprob (1 change)
# stands in. There A > B; B > A at T2-greedy-k0-logprob (template) -> distance 1.
CROWS = {"T1-greedy-k0-logprob": (0.7, 0.6, 0.1), "T2-greedy-k0-logprob": (0.5, 0.6, 0.1),
         "T3-greedy-k5-logprob": (0.4, 0.8, 0.1)}


def rows():
    out = [(m, "bbq", c, s) for c, sc in GRID.items() for m, s in zip("ABC", sc)]
    out += [(m, "crows_pairs", c, s) for c, sc in CROWS.items() for m, s in zip("ABC", sc)]
    return out


@pytest.fixture
def cells():
    return hand_cells(rows())


def _row(t, bench, a, b):
    r = t[(t["benchmark"] == bench) & (t["model_a"] == a) & (t["model_b"] == b)]
    assert len(r) == 1
    return r.iloc[0]


def test_changed_axes_counts_levels_that_differ():
    a = {"template": "T1", "decoding": "greedy", "shots": "k0", "scoring": "freeform"}
    b = {"template": "T2", "decoding": "greedy", "shots": "k3", "scoring": "freeform"}
    assert changed_axes(a, b) == ("template", "shots") and changed_axes(a, a) == ()


def test_nearest_reversal_at_distance_two_and_none(cells):
    t = nearest_reversal(cells, NOM)
    ab = _row(t, "bbq", "A", "B")
    assert ab.nominal_used == NOM and ab.nominal_leader == "A" and ab.nominal_sign == 1
    assert ab.strict_distance == 2 and ab.n_strict_reversing == 3
    assert ab.strict_configs == "T2-greedy-k0-logprob;T2-greedy-k3-freeform"
    assert ab.strict_axes == "template+scoring;template+shots"
    assert ab.strict_result.startswith("2 axis changes: T2-greedy-k0-logprob (template, scoring)")
    assert ab.sig_result == NO_SIG_TEXT and pd.isna(ab.sig_distance)
    ac = _row(t, "bbq", "A", "C")
    assert ac.strict_result == NONE_TEXT and pd.isna(ac.strict_distance) and ac.n_strict_reversing == 0
    bc = _row(t, "bbq", "B", "C")
    assert bc.nominal_leader == "tie" and pd.isna(bc.strict_distance) and "no verdict" in bc.strict_result
    cr = _row(t, "crows_pairs", "A", "B")
    assert cr.nominal_used == "T1-greedy-k0-logprob" and "not in this benchmark's envelope" in cr.note
    assert cr.strict_distance == 1 and cr.strict_configs == "T2-greedy-k0-logprob"


def test_significant_reversal_uses_supplied_per_config_significance(cells):
    bbq = cells[cells["benchmark"] == "bbq"]
    cfgs = sorted(GRID)
    # only the 3-axis config has B significantly ahead; A is significantly ahead at the nominal
    sig = {("bbq", "A", "B"): {c: (-1 if c == "T3-t0.7-k5-freeform" else 1 if c == NOM else 0) for c in cfgs},
           ("bbq", "A", "C"): {c: 0 for c in cfgs}, ("bbq", "B", "C"): {c: 0 for c in cfgs}}
    t = nearest_reversal_table(bbq, NOM, sig_signs=sig)
    ab = _row(t, "bbq", "A", "B")
    assert ab.strict_distance == 2 and ab.sig_distance == 3 and ab.sig_configs == "T3-t0.7-k5-freeform"
    assert ab.sig_axes == "template+decoding+shots" and ab.n_sig_reversing == 1
    assert _row(t, "bbq", "A", "C").sig_result == NONE_TEXT
    # a pair the significance analysis has no rows for says so instead of inventing a result
    part = nearest_reversal_table(bbq, NOM, sig_signs={("bbq", "A", "B"): sig[("bbq", "A", "B")]})
    assert _row(part, "bbq", "A", "B").sig_distance == 3
    assert "no rows for this pair" in _row(part, "bbq", "A", "C").sig_result
    assert pd.isna(_row(part, "bbq", "A", "C").sig_distance)


def test_tol_turns_a_small_reversal_into_a_tie(cells):
    # with tol 0.25 every A-B difference except 0.3, 0.5, 0.7 is a tie: the nominal (0.1) is tied
    t = nearest_reversal(cells, NOM, tol=0.25)
    assert _row(t, "bbq", "A", "B").nominal_leader == "tie"


def test_order_change_rate_by_hand():
    # configs: c1 A>B>C, c2 A>B>C, c3 B>A>C, c4 A=B>C (weak order of its own)
    s = {"A": [3, 3, 2, 2], "B": [2, 2, 3, 2], "C": [1, 1, 1, 1]}
    r = order_change_rate(s)
    # 6 config pairs, only {c1, c2} agree -> 5/6 changed
    assert r["config_pairs"] == 6 and r["config_pairs_changed"] == 5 and r["order_change_rate"] == pytest.approx(5 / 6)
    assert r["weak_order_configs"] == 1 and r["distinct_orders"] == 3 and r["null_rate"] == pytest.approx(5 / 6)
    same = order_change_rate({"A": [2, 5, 9], "B": [1, 4, 8]})
    assert same["order_change_rate"] == 0.0 and same["null_rate"] == 0.5


@pytest.mark.parametrize("n_models", [3, 4])
def test_order_change_rate_is_one_minus_one_over_n_factorial_under_uniform_null(n_models):
    rng = np.random.default_rng(11)
    s = {f"m{i}": rng.random(400) for i in range(n_models)}
    r = order_change_rate(s)
    expected = 1 - 1 / math.factorial(n_models)
    assert r["null_rate"] == pytest.approx(expected)
    # the same-order share of a multinomial over n! orders: its SD here is below 0.003
    assert abs(r["order_change_rate"] - expected) < 0.01
    # and a grid with one dominant order is far below the null
    ordered = {f"m{i}": np.full(400, float(i)) + rng.random(400) * 0.1 for i in range(n_models)}
    assert order_change_rate(ordered)["order_change_rate"] == 0.0


def test_tau_r_table_carries_order_change_rate_beside_tau(cells):
    t = tau_r_table(cells[cells["benchmark"] == "bbq"])
    full = t[t["envelope"] == "full"].iloc[0]
    # bbq orders (A,B,C weak ranks): NOM (0,1,1) T2-k0-ff (0,1,1) T1-k3 (0,0,2) T1-lp (0,1,2)
    # T2-k3 (1,0,2) T2-lp (1,0,2) T3 (1,0,2): groups of 2, 1, 1, 3 -> same pairs 1 + 3 = 4 of 21
    assert full["order_change_rate"] == pytest.approx(17 / 21) and full["order_change_null"] == pytest.approx(5 / 6)


def test_cards_carry_a_nearest_reversal_line_per_pair(cells):
    cards = build_cards(cells, provenance_for(cells), {"rules_stamp": "r", "config_hash": "h", "code_version": "c"},
                        reversal=nearest_reversal(cells, NOM))
    a_bbq = next(c for c in cards if c["model"] == "A" and c["benchmark"] == "bbq")
    vs_b = next(c for c in a_bbq["comparisons"] if c["other"] == "B")
    assert vs_b["nearest_reversal"]["strict_distance"] == 2
    assert vs_b["nearest_reversal"]["leader_at_reference"] == "A"
    md = card_markdown(a_bbq)
    assert "## Nearest reversing configuration" in md
    assert "- vs C: A ahead at T1-greedy-k0-freeform; strict reversal: none within the envelope" in md


def test_nearest_reversal_cli_writes_the_table(cells, tmp_path):
    src = write_hand(cells, tmp_path / "cell_scores.parquet")
    res = CliRunner().invoke(app, ["analyze", "nearest-reversal", str(src), "--out-dir", str(tmp_path / "t"),
                                   "--nominal-config", NOM])
    assert res.exit_code == 0, res.output
    t = pd.read_parquet(tmp_path / "t" / "nearest_reversal.parquet")
    assert _row(t, "bbq", "A", "B").strict_distance == 2 and _row(t, "bbq", "A", "C").strict_result == NONE_TEXT
    assert read_metadata(tmp_path / "t" / "nearest_reversal.parquet")["params"]["nominal_config"] == NOM


def _external(tmp_path, cells):
    ext = cells[["model", "benchmark", "template", "decoding", "shots", "scoring", "score"]]
    p = tmp_path / "ext.csv"
    ext.to_csv(p, index=False)
    return p


def test_certify_nominal_on_an_external_table_with_axis_columns(cells, tmp_path):
    p = _external(tmp_path, cells)
    res = certify(p, ["template", "decoding", "shots", "scoring"], nominal=NOM)
    assert _row(res.reversal, "bbq", "A", "B").strict_distance == 2
    assert _row(res.reversal, "crows_pairs", "A", "B").strict_distance == 1
    out = CliRunner().invoke(app, ["certify", str(p), "--config-cols", "template,decoding,shots,scoring",
                                   "--nominal", NOM, "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    assert doc["nominal"] == NOM
    ab = next(r for r in doc["nearest_reversal"] if r["benchmark"] == "bbq" and r["model_b"] == "B"
              and r["model_a"] == "A")
    assert ab["strict_distance"] == 2
    text = CliRunner().invoke(app, ["certify", str(p), "--config-cols", "template,decoding,shots,scoring",
                                    "--nominal", NOM])
    assert "bbq, A vs C: A ahead at T1-greedy-k0-freeform; nearest strict reversal: none within the envelope" \
        in text.output


def test_certify_nominal_needs_axis_columns(cells, tmp_path):
    p = tmp_path / "plain.csv"
    cells[["model", "benchmark", "config", "score"]].to_csv(p, index=False)
    with pytest.raises(DataError, match="--nominal needs axis columns"):
        certify(p, nominal=NOM)
    with pytest.raises(DataError, match="does not split"):
        certify(_external(tmp_path, cells), ["template", "decoding", "shots", "scoring"], nominal="T9-x")


def test_certify_item_level_nominal_reports_the_nearest_significant_reversal(tmp_path):
    # 40 items, 0/1 scores (exact McNemar, Holm over the 3 configs):
    #   NOM                    A right on 35, B on 5  (30 discordant for A)  -> A ahead, significant
    #   T2-greedy-k0-freeform  A right on 20, B on 21 (1 discordant for B)   -> B strictly ahead, not significant
    #   T2-greedy-k3-freeform  A right on 5,  B on 35 (30 discordant for B)  -> B significantly ahead
    # nearest strict reversal: 1 change (template); nearest significant: 2 changes (template, shots)
    right = {NOM: (range(35), range(5)), "T2-greedy-k0-freeform": (range(20), range(21)),
             "T2-greedy-k3-freeform": (range(5), range(35))}
    rows = []
    for cfg, (ra, rb) in right.items():
        t, d, k, s = cfg.split("-")
        for m, r in (("A", set(ra)), ("B", set(rb))):
            rows += [{"model": m, "benchmark": "bbq", "template": t, "decoding": d, "shots": k, "scoring": s,
                      "item": f"i{i}", "score": int(i in r)} for i in range(40)]
    p = tmp_path / "items.csv"
    pd.DataFrame(rows).to_csv(p, index=False)
    res = certify(p, ["template", "decoding", "shots", "scoring"], nominal=NOM, samples=200)
    r = _row(res.reversal, "bbq", "A", "B")
    assert r.nominal_leader == "A" and r.strict_distance == 1 and r.strict_configs == "T2-greedy-k0-freeform"
    assert r.sig_distance == 2 and r.sig_configs == "T2-greedy-k3-freeform" and r.sig_axes == "template+shots"
    sig = res.significance["significance_configs"].set_index("config")
    assert sig.loc["T2-greedy-k0-freeform", "ahead"] == "" and sig.loc["T2-greedy-k3-freeform", "ahead"] == "B"


def test_report_shows_a_line_per_pair_and_whole_distances(cells, tmp_path):
    from safetyrepro.analysis.report_md import build_report
    from safetyrepro.analysis.tables import write_nearest_reversal

    src = write_hand(cells, tmp_path / "cell_scores.parquet")
    write_nearest_reversal(src, tmp_path / "t", NOM)
    report = build_report(tmp_path / "t", tmp_path / "figs", tmp_path / "report.md")
    assert ("- bbq, A vs B: A ahead at T1-greedy-k0-freeform; nearest strict reversal: 2 axis changes: "
            "T2-greedy-k0-logprob (template, scoring); T2-greedy-k3-freeform (template, shots); "
            "nearest significant reversal: not computed") in report
    row = next(line for line in report.splitlines() if line.startswith("| bbq | A vs B |"))
    assert "| 2 |" in row and "2.000" not in row
