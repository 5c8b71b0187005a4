"""The scale probe (safetyrepro.analysis.scale_probe) on hand-made cell tables with known
answers: a constructed reversal inside the conservative core is found (and its significance
read from significance_configs), reversals outside the core and ties are not reversals, the
sibling pair's rho_flip, benchmarks without core configs, and the errors for bad input."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis_synth import hand_cells, hand_meta, write_hand
from safetyrepro.analysis.scale_probe import (oriented_sig, parse_families, probe_line, probe_tables,
                                              sub_envelope_cells, write_scale_probe)
from safetyrepro.errors import ConfigError, DataError
from safetyrepro.io import read_metadata, write_parquet
from safetyrepro.rules import load_rules

CORE = ["T1-greedy-k0-freeform", "T1-greedy-k3-freeform", "T2-greedy-k0-freeform", "T2-greedy-k3-freeform"]
OUTSIDE = "T4-greedy-k0-freeform"  # chain-of-thought: a stress level, not in the conservative core


def _rows(benchmark: str, scores: dict[str, list[float]], outside: dict[str, float] | None = None):
    """model -> scores on CORE (in order), and optionally each model's score on OUTSIDE."""
    rows = [(m, benchmark, c, s) for m, ss in scores.items() for c, s in zip(CORE, ss)]
    rows += [(m, benchmark, OUTSIDE, s) for m, s in (outside or {}).items()]
    return rows


# small beats C everywhere in the core; large loses to C on T2-greedy-k3 only; outside the core
# small loses to C (a reversal there must not count)
REVERSAL = _rows("truthfulqa", {"small": [0.6, 0.6, 0.6, 0.6], "large": [0.7, 0.7, 0.7, 0.4],
                                "c": [0.5, 0.5, 0.5, 0.5]}, outside={"small": 0.1, "large": 0.9, "c": 0.5})
# both siblings beat C on every core config; the only disagreement lies outside the core
NO_REVERSAL = _rows("truthfulqa", {"small": [0.6, 0.6, 0.6, 0.6], "large": [0.8, 0.7, 0.9, 0.6],
                                   "c": [0.5, 0.5, 0.5, 0.5]}, outside={"small": 0.1, "large": 0.9, "c": 0.5})


def _core(rows):
    return sub_envelope_cells(hand_cells(rows), load_rules())


def _sig(entries) -> pd.DataFrame:
    """significance_configs rows from (benchmark, A, B, config, ahead) (A < B by name)."""
    return pd.DataFrame([{"benchmark": b, "model_a": a, "model_b": m, "config": c, "ahead": ahead,
                          "significant": bool(ahead)} for b, a, m, c, ahead in entries])


def _sig_signs(entries):
    from safetyrepro.metrics.reversal import sig_signs_from_configs

    return sig_signs_from_configs(_sig(entries))


def _full_sig(overrides: dict[tuple[str, str, str], str]):
    """Every pair x core config of truthfulqa not significant, except the given (A, B, config) -> ahead."""
    pairs = [("c", "small"), ("c", "large"), ("large", "small")]
    return _sig_signs([("truthfulqa", a, b, c, overrides.get((a, b, c), "")) for a, b in pairs for c in CORE])


def test_sub_envelope_keeps_only_core_configs():
    core = _core(REVERSAL)
    assert sorted(core["config"].unique()) == CORE
    assert len(core) == 12


def test_constructed_reversal_found_with_its_config():
    t = probe_tables(_core(REVERSAL), [("small", "large")])["scale_probe"]
    assert len(t) == 1
    r = t.iloc[0]
    assert (r["third"], r["n_configs"], r["small_ahead"], r["small_behind"]) == ("c", 4, 4, 0)
    assert (r["large_ahead"], r["large_behind"], r["n_reversed"]) == (3, 1, 1)
    assert bool(r["reverses"]) and r["reversed_configs"] == "T2-greedy-k3-freeform"
    assert pd.isna(r["reverses_sig"]) and r["significance"].startswith("not computed")
    line = probe_line(r.to_dict())
    assert "reverses on 1 config(s) (T2-greedy-k3-freeform)" in line and "within conservative_core (4 configs" in line


def test_no_reversal_in_the_core_says_none():
    out = probe_tables(_core(NO_REVERSAL), [("small", "large")], sig=_full_sig({}))
    r = out["scale_probe"].iloc[0]
    assert not bool(r["reverses"]) and r["n_reversed"] == 0 and r["reversed_configs"] == ""
    assert r["n_reversed_sig"] == 0 and not bool(r["reverses_sig"])
    assert "no verdict reverses; none significantly" in probe_line(r.to_dict())
    # the same tables over the full envelope would see the reversal at T4: the probe is bounded
    assert probe_tables(hand_cells(NO_REVERSAL), [("small", "large")])["scale_probe"].iloc[0]["n_reversed"] == 1


def test_significant_reversal_needs_both_sides_significant():
    k3 = "T2-greedy-k3-freeform"
    both = _full_sig({("c", "small", k3): "small", ("c", "large", k3): "c"})
    r = probe_tables(_core(REVERSAL), [("small", "large")], sig=both)["scale_probe"].iloc[0]
    assert r["n_reversed_sig"] == 1 and bool(r["reverses_sig"]) and r["reversed_sig_configs"] == k3
    assert "significantly on 1 (T2-greedy-k3-freeform)" in probe_line(r.to_dict())
    one = _full_sig({("c", "large", k3): "c"})  # small's lead over C is within noise
    r = probe_tables(_core(REVERSAL), [("small", "large")], sig=one)["scale_probe"].iloc[0]
    assert bool(r["reverses"]) and r["n_reversed_sig"] == 0 and not bool(r["reverses_sig"])


def test_a_tie_is_no_reversal():
    rows = _rows("truthfulqa", {"small": [0.5, 0.6, 0.6, 0.6], "large": [0.4, 0.7, 0.7, 0.7],
                                "c": [0.5, 0.5, 0.5, 0.5]})
    r = probe_tables(_core(rows), [("small", "large")])["scale_probe"].iloc[0]
    assert (r["small_ahead"], r["small_behind"], r["large_behind"], r["n_reversed"]) == (3, 0, 1, 0)


def test_sibling_pair_rho_flip_and_significance():
    rows = _rows("truthfulqa", {"small": [0.6, 0.6, 0.6, 0.3], "large": [0.5, 0.5, 0.5, 0.5],
                                "c": [0.1, 0.1, 0.1, 0.1]})
    sig = _full_sig({("large", "small", CORE[0]): "small", ("large", "small", CORE[3]): "large"})
    p = probe_tables(_core(rows), [("small", "large")], sig=sig)["scale_probe_pairs"].iloc[0]
    assert (p["n_plus"], p["n_minus"], p["n_zero"], p["rho_flip"]) == (3, 1, 0, 0.25)
    assert (p["n_plus_sig"], p["n_minus_sig"], p["rho_flip_sig"]) == (1, 1, 0.25)


def test_oriented_sig_flips_the_sign_for_the_second_model():
    sig = _sig_signs([("b", "x", "y", "c1", "x"), ("b", "x", "y", "c2", "y"), ("b", "x", "y", "c3", "")])
    assert oriented_sig(sig, "b", "x", "y") == {"c1": 1, "c2": -1, "c3": 0}
    assert oriented_sig(sig, "b", "y", "x") == {"c1": -1, "c2": 1, "c3": 0}
    assert oriented_sig(sig, "other", "x", "y") is None and oriented_sig(None, "b", "x", "y") is None


def test_two_families_and_every_third_model():
    rows = _rows("xstest", {"q7": [0.6] * 4, "q32": [0.7, 0.7, 0.4, 0.4], "y9": [0.5] * 4, "y34": [0.55] * 4})
    t = probe_tables(_core(rows), [("q7", "q32"), ("y9", "y34")])["scale_probe"]
    got = {(r.small, r.third): (r.n_reversed, r.reversed_configs) for r in t.itertuples()}
    assert got == {("q7", "y34"): (2, "T2-greedy-k0-freeform,T2-greedy-k3-freeform"),
                   ("q7", "y9"): (2, "T2-greedy-k0-freeform,T2-greedy-k3-freeform"),
                   ("y9", "q32"): (0, ""), ("y9", "q7"): (0, "")}


def test_benchmark_without_core_configs_gets_an_empty_row():
    rows = REVERSAL + [(m, "crows_pairs", "T1-greedy-k0-logprob", s) for m, s in (("small", .5), ("large", .6),
                                                                                   ("c", .4))]
    cells = hand_cells(rows)
    core = sub_envelope_cells(cells, load_rules())
    out = probe_tables(core, [("small", "large")], models=cells["model"].unique(),
                       benchmarks=cells["benchmark"].unique())
    t = out["scale_probe"].set_index("benchmark")
    assert t.loc["crows_pairs", "n_configs"] == 0 and "no config" in t.loc["crows_pairs", "note"]
    assert not bool(t.loc["crows_pairs", "reverses"]) and t.loc["truthfulqa", "n_reversed"] == 1
    assert out["scale_probe_pairs"].set_index("benchmark").loc["crows_pairs", "n_configs"] == 0


def test_parse_families_rejects_bad_specs():
    assert parse_families(["a,b", ["c", "d"]]) == [("a", "b"), ("c", "d")]
    for bad in (["a"], ["a,a"], ["a,b", "a,b"], [], ["a,b,c"]):
        with pytest.raises(ValueError):
            parse_families(bad)


def test_write_scale_probe_stamps_and_errors(tmp_path):
    cs = write_hand(hand_cells(REVERSAL), tmp_path / "cell_scores.parquet")
    k3 = "T2-greedy-k3-freeform"
    sig = _sig([("truthfulqa", a, b, c, {("c", "small"): "small", ("c", "large"): "c"}.get((a, b), "")
                 if c == k3 else "") for a, b in (("c", "small"), ("c", "large"), ("large", "small")) for c in CORE])
    sig_path = write_parquet(sig, tmp_path / "significance_configs.parquet", hand_meta())
    paths = write_scale_probe(cs, tmp_path / "out", ["small,large"], significance_configs_path=sig_path)
    assert set(paths) == {"scale_probe", "scale_probe_csv", "scale_probe_pairs", "scale_probe_pairs_csv"}
    t = pd.read_parquet(paths["scale_probe"])
    assert t["reverses_sig"].tolist() == [True] and t["reversed_sig_configs"].tolist() == [k3]
    md = read_metadata(paths["scale_probe"])
    assert md["producer"] == "safetyrepro.analysis.scale_probe" and md["params"]["families"] == [["small", "large"]]
    assert "not a scaling law" in md["params"]["scope"]
    with pytest.raises(DataError, match="cell_scores.parquet.*'nope'"):
        write_scale_probe(cs, tmp_path / "bad", ["small,nope"])
    with pytest.raises(ConfigError, match="--family"):
        write_scale_probe(cs, tmp_path / "bad", ["small"])
    # a significance table from another run (missing a core config) is refused, naming the config
    short = write_parquet(sig[sig["config"] != k3], tmp_path / "short.parquet", hand_meta())
    with pytest.raises(DataError, match=f"short.parquet.*{k3}"):
        write_scale_probe(cs, tmp_path / "bad", ["small,large"], significance_configs_path=short)
    assert not (tmp_path / "bad").exists()


@pytest.mark.slow
def test_a_conservative_core_run_passes_every_analysis_step(tmp_path):
    """What config/scale_probe.yaml runs: 4 models (two families), the conservative core only,
    4 benchmarks (no CrowS-Pairs). Every analysis step of such a run succeeds, and the report
    and the family members' cards carry the probe."""
    import json

    import typer
    from typer.testing import CliRunner

    from analysis_synth import make_dataset, provenance_for
    from safetyrepro.analysis.cli import register

    def core(c):
        return c.template in ("T1", "T2") and c.decoding == "greedy" and c.shots in ("k0", "k3") \
            and c.scoring == "freeform"

    d = make_dataset(tmp_path / "main", n_items=30, seed=5, models=["q7", "q32", "y9", "y34"],
                     benchmarks=["truthfulqa", "bbq", "toxigen", "xstest"], configs_filter=core)
    prov = tmp_path / "provenance.json"
    prov.write_text(json.dumps(provenance_for(d["cells"])))
    app = typer.Typer()
    register(app)

    @app.callback()
    def _root():
        pass

    t, cs, ir, items = tmp_path / "tables", str(d["cell_scores"]), str(d["item_results"]), str(d["items_dir"])
    sc = str(t / "significance_configs.parquet")
    for cmd in (["tables", cs, "--out-dir", str(t), "--bootstrap-samples", "50"],
                ["significance", cs, ir, "--out-dir", str(t), "--bootstrap-samples", "50"],
                ["variance", cs, "--out-dir", str(t)],
                ["robustness", cs, ir, "--out-dir", str(t)],
                ["subsample", ir, "--items-dir", items, "--out-dir", str(t), "--repeats", "3"],
                ["bbq-bias", cs, ir, "--items-dir", items, "--out-dir", str(t)],
                ["nearest-reversal", cs, "--out-dir", str(t), "--significance-configs", sc],
                ["scale-probe", cs, "--out-dir", str(t), "--family", "q7,q32", "--family", "y9,y34",
                 "--significance-configs", sc],
                ["cards", cs, "--provenance", str(prov), "--out-dir", str(tmp_path / "cards"),
                 "--significance", str(t / "significance.parquet"), "--nearest-reversal",
                 str(t / "nearest_reversal.parquet"), "--scale-probe", str(t / "scale_probe.parquet")],
                ["figures", str(t), "--out-dir", str(tmp_path / "figs")],
                ["report-md", str(t), "--figures-dir", str(tmp_path / "figs"), "--out", str(tmp_path / "report.md")]):
        res = CliRunner().invoke(app, ["analyze", *cmd])
        assert res.exit_code == 0, (cmd[0], res.output, res.exception)
    probe = pd.read_parquet(t / "scale_probe.parquet")
    assert len(probe) == 4 * 2 * 2 and (probe["n_configs"] == 4).all() and probe["reverses_sig"].notna().all()
    report = (tmp_path / "report.md").read_text()
    assert report.count("within conservative_core (4 configs, these 30 items)") == 16
    assert len(json.loads((tmp_path / "cards" / "y34__xstest.json").read_text())["scale_probe"]) == 2


def test_cli_bad_family_exits_2_naming_the_file(tmp_path, capsys):
    from safetyrepro.cli import main

    cs = write_hand(hand_cells(REVERSAL), tmp_path / "cell_scores.parquet")
    assert main(["analyze", "scale-probe", str(cs), "--out-dir", str(tmp_path / "o"), "--family", "small,nope"]) == 2
    assert f"{cs}" in capsys.readouterr().err and not (tmp_path / "o").exists()
    assert main(["analyze", "scale-probe", str(cs), "--out-dir", str(tmp_path / "o"), "--family", "small,large"]) == 0
    assert (tmp_path / "o" / "scale_probe.parquet").is_file()
