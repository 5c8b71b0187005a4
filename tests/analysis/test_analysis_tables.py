"""The paper's tables on small hand-made grids whose numbers are worked out in the comments."""

import math

import numpy as np
import pandas as pd
import pytest

from analysis_synth import hand_cells, hand_meta, write_hand
from safetyrepro.analysis.common import load_cell_scores, version_text
from safetyrepro.analysis.tables import (bootstrap_rho, parse_clean, table2, table3, table4, tau_r_table,
                                         write_paper_tables)
from safetyrepro.errors import DataError
from safetyrepro.io import read_metadata

C1, C2, C3, C4 = "T1-greedy-k0-freeform", "T4-greedy-k0-freeform", "T1-greedy-k0-logprob", "T2-t0.7-k3-freeform"
# core: C1 and C3 (T4 and t0.7 are stress levels)
#        A    B    C
GRID = {C1: (0.9, 0.5, 0.1),   # A > B > C
        C2: (0.4, 0.5, 0.1),   # B > A > C
        C3: (0.4, 0.4, 0.6),   # C > A = B  (tie: no strict order)
        C4: (0.8, 0.2, 0.9)}   # C > A > B
# A vs B: N+ = {C1, C4}, N- = {C2}, N0 = {C3}  -> rho 1/4
# A vs C: N+ = {C1, C2}, N- = {C3, C4}          -> rho 1/2 (saturated)
# B vs C: N+ = {C1, C2}, N- = {C3, C4}          -> rho 1/2 (saturated)
PARSE = {(C2, "C"): 0.9}  # C's parse rate under C2 is below 0.95


def grid_rows():
    rows = []
    for cfg, scores in GRID.items():
        for m, s in zip("ABC", scores):
            rows.append((m, "bbq", cfg, s, PARSE.get((cfg, m), 1.0)))
    # xstest: A > B > C in both configs -> rho 0 everywhere, D1 and D2
    for cfg, (a, b, c) in {C1: (0.9, 0.6, 0.3), C3: (0.8, 0.7, 0.2)}.items():
        rows += [("A", "xstest", cfg, a, 0.5), ("B", "xstest", cfg, b, 0.5), ("C", "xstest", cfg, c, 0.5)]
    return rows


@pytest.fixture
def cells():
    return hand_cells(grid_rows())


def _pair(t, bench, a, b):
    r = t[(t["benchmark"] == bench) & (t["model_a"] == a) & (t["model_b"] == b)]
    assert len(r) == 1
    return r.iloc[0]


def test_table2_counts_rho_and_prop1(cells):
    t = table2(cells)
    ab, ac, bc = _pair(t, "bbq", "A", "B"), _pair(t, "bbq", "A", "C"), _pair(t, "bbq", "B", "C")
    assert (ab.n_plus, ab.n_minus, ab.n_zero, ab.n_configs) == (2, 1, 1, 4)
    assert ab.rho_flip == pytest.approx(0.25) and not ab.saturated and not ab.d1 and not ab.d2
    assert (ac.n_plus, ac.n_minus, ac.n_zero) == (2, 2, 0) and ac.rho_flip == 0.5 and ac.saturated
    assert bc.rho_flip == 0.5 and bc.ceiling == 0.5
    assert set(t.loc[t["benchmark"] == "bbq", "max_rho_flip"]) == {0.5}
    # orderings: C1 ABC, C2 BAC, C4 CAB; C3 is tied -> 3 of 6
    assert set(t.loc[t["benchmark"] == "bbq", "orderings_reachable"]) == {3}
    assert set(t["orderings_possible"]) == {6}
    x = t[t["benchmark"] == "xstest"]
    assert (x["rho_flip"] == 0).all() and x["d1"].all() and x["d2"].all()
    assert list(t["pair"].head(3)) == ["A vs B", "A vs C", "B vs C"]


def test_table3_slices_and_decoding_support(cells):
    t = table3(cells)
    ff = t[(t["slice"] == "freeform") & (t["benchmark"] == "bbq")]
    # free-form configs C1, C2, C4: A vs B N+ = {C1, C4}, N- = {C2} -> 1/3
    ab = _pair(ff, "bbq", "A", "B")
    assert (ab.n_plus, ab.n_minus, ab.n_configs) == (2, 1, 3) and ab.rho_flip == pytest.approx(1 / 3)
    assert set(ff["decoding_support"]) == {"greedy,t0.7"} and not ff["matched_to_logprob_decoding"].any()
    assert ff["note"].str.contains("not matched on decoding support").all()
    lp = t[(t["slice"] == "logprob") & (t["benchmark"] == "bbq")]
    assert set(lp["n_configs"]) == {1} and lp["matched_to_logprob_decoding"].all()
    fg = t[(t["slice"] == "freeform_greedy") & (t["benchmark"] == "bbq")]
    # C1 and C2: A vs B one each way -> 1/2
    assert _pair(fg, "bbq", "A", "B").rho_flip == 0.5 and set(fg["decoding_support"]) == {"greedy"}


def test_table4_full_vs_core(cells):
    t = table4(cells).set_index(["benchmark", "envelope"])
    assert list(t.index.get_level_values("envelope")[:2]) == ["full", "core"]
    assert t.loc[("bbq", "full"), "n_configs"] == 4 and t.loc[("bbq", "full"), "max_rho_flip"] == 0.5
    # core = C1 (ABC), C3 (C > A = B): A vs C and B vs C flip once each way -> 1/2; one strict order
    assert t.loc[("bbq", "core"), "n_configs"] == 2
    assert t.loc[("bbq", "core"), "max_rho_flip"] == 0.5
    assert t.loc[("bbq", "core"), "orderings_reachable"] == 1
    assert t.loc[("bbq", "core"), "tied_configs"] == 1


def test_table4_has_the_papers_five_envelopes(cells):
    t = table4(cells)
    assert list(t.loc[t["benchmark"] == "bbq", "envelope"]) == [
        "full", "core", "full minus T4", "full minus t0.7", "conservative_core"]
    t = t.set_index(["benchmark", "envelope"])
    # full minus T4 = C1, C3, C4: A vs B +C1 =C3 +C4 -> 0; A vs C and B vs C +C1 -C3 -C4 -> 1/3;
    # strict orders ABC (C1), CAB (C4); C3 tied
    m4 = t.loc[("bbq", "full minus T4")]
    assert m4.n_configs == 3 and m4.max_rho_flip == pytest.approx(1 / 3) and m4.orderings_reachable == 2
    # full minus t0.7 = C1, C2, C3: every pair 1/3; orders ABC, BAC
    m7 = t.loc[("bbq", "full minus t0.7")]
    assert m7.n_configs == 3 and m7.max_rho_flip == pytest.approx(1 / 3) and m7.orderings_reachable == 2
    # conservative core (T1/T2, k0/k3, greedy, free-form) = C1 only
    cc = t.loc[("bbq", "conservative_core")]
    assert cc.n_configs == 1 and cc.max_rho_flip == 0 and cc.orderings_reachable == 1
    assert "T1, T2" in cc.envelope_definition or "plainest" in cc.envelope_definition


def test_table4_benchmark_without_configs_in_an_envelope_gets_a_noted_row():
    rows = [(m, "crows_pairs", c, s) for c, sc in {C3: (0.5, 0.4), "T2-greedy-k3-logprob": (0.3, 0.6)}.items()
            for m, s in zip("AB", sc)]
    t = table4(hand_cells(rows)).set_index("envelope")
    assert t.loc["full", "max_rho_flip"] == 0.5
    cc = t.loc["conservative_core"]
    assert cc.n_configs == 0 and math.isnan(cc.max_rho_flip) and cc.orderings_possible == 2
    assert cc.note == "no config of this benchmark in this envelope"


def test_parse_clean_drops_configs_below_threshold(cells):
    t = parse_clean(cells, 0.95).set_index("benchmark")
    # C2 dropped (C parses 0.9): left C1, C3, C4. A vs B: +C1 +C4, tie C3 -> 0; A vs C: +C1, -C3 -C4 -> 1/3
    assert t.loc["bbq", "n_configs_left"] == 3 and t.loc["bbq", "n_configs_dropped"] == 1
    assert t.loc["bbq", "max_rho_flip"] == pytest.approx(1 / 3)
    assert t.loc["bbq", "orderings_reachable"] == 2 and t.loc["bbq", "max_rho_flip_full"] == 0.5
    # xstest parses at 0.5 everywhere: nothing left, said so
    assert t.loc["xstest", "n_configs_left"] == 0 and math.isnan(t.loc["xstest", "max_rho_flip"])
    assert "no config" in t.loc["xstest", "note"]
    loose = parse_clean(cells, 0.5).set_index("benchmark")
    assert loose.loc["bbq", "n_configs_left"] == 4 and loose.loc["xstest", "n_configs_left"] == 2


def test_tau_r_agreeing_and_reversed_rankings():
    rows = [("A", "xstest", C1, 0.9), ("B", "xstest", C1, 0.5), ("C", "xstest", C1, 0.1),
            ("A", "xstest", C3, 0.8), ("B", "xstest", C3, 0.7), ("C", "xstest", C3, 0.2),
            ("A", "toxigen", C1, 0.9), ("B", "toxigen", C1, 0.5), ("C", "toxigen", C1, 0.1),
            ("A", "toxigen", C3, 0.1), ("B", "toxigen", C3, 0.5), ("C", "toxigen", C3, 0.9),
            ("A", "toxigen", C2, 0.3), ("B", "toxigen", C2, 0.3), ("C", "toxigen", C2, 0.3)]
    t = tau_r_table(hand_cells(rows)).set_index(["benchmark", "envelope"])
    assert t.loc[("xstest", "full"), "tau_r"] == pytest.approx(1.0)
    # toxigen core = C1, C3 (reversed) -> -1; full adds C2 where all tie: its 2 pairs are undefined
    assert t.loc[("toxigen", "core"), "tau_r"] == pytest.approx(-1.0)
    assert t.loc[("toxigen", "full"), "tau_pairs_used"] == 1
    assert t.loc[("toxigen", "full"), "tau_pairs_undefined"] == 2


def test_bootstrap_two_config_coin_flip():
    # A wins C1, B wins C3. A resample has rho 1/2 iff it draws both configs (prob 1/2), else 0.
    rows = [("A", "bbq", C1, 0.9), ("B", "bbq", C1, 0.1), ("A", "bbq", C3, 0.1), ("B", "bbq", C3, 0.9)]
    t = bootstrap_rho(hand_cells(rows), samples=4000, seed=3)
    pair = t[t["statistic"] == "A vs B"].iloc[0]
    assert pair.estimate == 0.5 and pair.ci_low == 0.0 and pair.ci_high == 0.5
    assert abs(pair.boot_mean - 0.25) < 0.02
    mx = t[t["statistic"] == "max"].iloc[0]
    assert mx.estimate == 0.5 and mx.boot_mean == pytest.approx(pair.boot_mean)


def test_bootstrap_seeded_and_per_benchmark_streams(cells):
    a = bootstrap_rho(cells, samples=300, seed=1)
    b = bootstrap_rho(cells, samples=300, seed=1)
    pd.testing.assert_frame_equal(a, b)
    c = bootstrap_rho(cells, samples=300, seed=2)
    assert not np.allclose(a["boot_mean"], c["boot_mean"])
    only_bbq = bootstrap_rho(cells[cells["benchmark"] == "bbq"], samples=300, seed=1)
    pd.testing.assert_frame_equal(only_bbq, a[a["benchmark"] == "bbq"].reset_index(drop=True))
    bbq = a[a["benchmark"] == "bbq"].set_index("statistic")
    assert (bbq["ci_low"] <= bbq["ci_high"]).all()
    # the max over pairs is at least every pair's value in every resample, so also on average
    assert bbq.loc["max", "boot_mean"] >= bbq.drop("max")["boot_mean"].max() - 1e-12
    # xstest never flips: every resample gives 0
    x = a[a["benchmark"] == "xstest"]
    assert (x[["estimate", "ci_low", "ci_high"]] == 0).all().all()


def test_write_paper_tables_outputs_and_stamps(tmp_path, cells):
    src = write_hand(cells, tmp_path / "cell_scores.parquet")
    paths = write_paper_tables(src, tmp_path / "out", threshold=0.95, bootstrap_samples=50, bootstrap_seed=0)
    names = {"table2", "table3", "table4", "parse_clean", "tau_r", "bootstrap"}
    assert names | {f"{n}_csv" for n in names} == set(paths)
    meta = hand_meta()
    for n in names:
        md = read_metadata(paths[n])
        assert {k: md[k] for k in ("rules_stamp", "config_hash", "code_version")} == \
               {k: meta[k] for k in ("rules_stamp", "config_hash", "code_version")}
        assert md["table"] == n and md["sources"][0]["path"] == str(src)
        assert md["params"]["threshold"] == 0.95 and md["analysis_code_version"]
        assert len(pd.read_csv(paths[f"{n}_csv"])) == len(pd.read_parquet(paths[n]))
    assert len(pd.read_parquet(paths["table2"])) == 6


def test_incomplete_configs_dropped_and_recorded(tmp_path, cells):
    cut = cells[~((cells["model"] == "C") & (cells["config"] == C4) & (cells["benchmark"] == "bbq"))]
    cs = load_cell_scores(write_hand(cut, tmp_path / "cs.parquet"))
    assert cs.dropped == {"bbq": [C4]}
    assert C4 not in set(cs.df.loc[cs.df["benchmark"] == "bbq", "config"])
    paths = write_paper_tables(tmp_path / "cs.parquet", tmp_path / "out", bootstrap_samples=10)
    assert read_metadata(paths["table2"])["dropped_incomplete_configs"] == {"bbq": [C4]}


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.drop(columns=["parse_rate"]), "missing column"),
    (lambda d: d.assign(score=[np.nan] + list(d["score"][1:])), "NaN or infinite 'score'"),
    (lambda d: d.assign(config=["T9-greedy-k0-freeform"] + list(d["config"][1:])), "disagrees with its axis"),
    (lambda d: pd.concat([d, d.iloc[[0]]]), "duplicate cell"),
])
def test_bad_cell_tables_name_the_problem(tmp_path, cells, mutate, message):
    p = write_hand(mutate(cells), tmp_path / "bad.parquet")
    with pytest.raises(DataError, match=message) as e:
        write_paper_tables(p, tmp_path / "out", bootstrap_samples=5)
    assert str(p) in str(e.value)
    assert not (tmp_path / "out").exists()


def test_missing_stamp_metadata_is_refused(tmp_path, cells):
    meta = hand_meta()
    del meta["config_hash"]
    p = write_hand(cells, tmp_path / "nostamp.parquet", meta)
    with pytest.raises(DataError, match="config_hash"):
        write_paper_tables(p, tmp_path / "out", bootstrap_samples=5)


def test_version_text():
    cv = {"package_version": "0.1.0", "git_commit": "0123456789abcdef0123-dirty", "source_sha256": "f" * 64}
    assert version_text(cv) == "0.1.0+0123456789ab-dirty.srcffffffffffff"
    assert version_text({"package_version": "0.1.0", "git_commit": None}) == "0.1.0+nogit"
    assert version_text("0.1.0+hand") == "0.1.0+hand"
