"""Every analysis output from a synthetic full-size result set (3 models x 5 benchmarks x every
valid config of the real envelope), run through the `analyze` CLI commands."""

import json

import pandas as pd
import pytest
import typer
from typer.testing import CliRunner

from analysis_synth import make_dataset, provenance_for
from safetyrepro.analysis.cli import register
from safetyrepro.analysis.common import load_cell_scores
from safetyrepro.io import read_metadata
from safetyrepro.metrics import benchmark_summary, pairwise_table
from safetyrepro.provenance import code_fingerprint, stale_reason

pytestmark = pytest.mark.slow

STAMP_KEYS = ("rules_stamp", "config_hash", "code_version")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("full")
    d = make_dataset(root / "main", n_items=40, seed=7)
    bf = make_dataset(root / "bf16", n_items=40, seed=8, quantization="bf16",
                      configs_filter=lambda c: c.template in ("T1", "T2") and c.decoding == "greedy"
                      and (c.shots in ("k0", "k3") and c.scoring == "freeform" or c.shots == "k0"))
    prov = root / "provenance.json"
    prov.write_text(json.dumps(provenance_for(d["cells"])))
    app = typer.Typer()
    register(app)

    @app.callback()
    def _root():  # keep `analyze` a sub-command as it is under the real CLI
        pass

    runner = CliRunner()
    tables, figs, cards = root / "tables", root / "figures", root / "cards"
    cs, ir, items = str(d["cell_scores"]), str(d["item_results"]), str(d["items_dir"])
    commands = [
        ["analyze", "tables", cs, "--out-dir", str(tables), "--bootstrap-samples", "200", "--bootstrap-seed", "1",
         "--item-results", ir, "--noise-samples", "200"],
        ["analyze", "significance", cs, ir, "--out-dir", str(tables), "--bootstrap-samples", "200",
         "--bootstrap-seed", "1"],
        ["analyze", "variance", cs, "--out-dir", str(tables)],
        ["analyze", "robustness", cs, ir, "--out-dir", str(tables)],
        ["analyze", "subsample", ir, "--items-dir", items, "--out-dir", str(tables), "--repeats", "5",
         "--seed", "1", "--noise-samples", "200"],
        ["analyze", "bbq-bias", cs, ir, "--items-dir", items, "--out-dir", str(tables)],
        ["analyze", "precision", cs, str(bf["cell_scores"]), "--out-dir", str(tables)],
        ["analyze", "nearest-reversal", cs, "--out-dir", str(tables),
         "--significance-configs", str(tables / "significance_configs.parquet")],
        ["analyze", "scale-probe", cs, "--out-dir", str(tables), "--family", "alpha,beta",
         "--significance-configs", str(tables / "significance_configs.parquet")],
        ["analyze", "cards", cs, "--provenance", str(prov), "--out-dir", str(cards),
         "--significance", str(tables / "significance.parquet"),
         "--nearest-reversal", str(tables / "nearest_reversal.parquet"),
         "--precision", str(tables / "precision.parquet"),
         "--scale-probe", str(tables / "scale_probe.parquet")],
        ["analyze", "figures", str(tables), "--out-dir", str(figs)],
        ["analyze", "report-md", str(tables), "--figures-dir", str(figs), "--out", str(root / "report.md")],
    ]
    printed = {}  # step -> {name: path} as the command printed what it wrote
    for cmd in commands:
        res = runner.invoke(app, cmd)
        assert res.exit_code == 0, (cmd, res.output, res.exception)
        printed[cmd[1]] = dict(line.split("\t", 1) for line in res.stdout.splitlines() if "\t" in line)
    return {"root": root, "data": d, "tables": tables, "figures": figs, "cards": cards, "printed": printed}


def test_each_step_writes_exactly_the_outputs_the_package_lists(run):
    """The output-name lists its rule declares (safetyrepro.analysis.outputs; see
    test_workflow_lint's dry-run test for the rules' side) are what each step writes: its
    printed paths, and every file in the output folders, nothing more."""
    from safetyrepro.analysis import outputs

    def as_str(paths):
        return {k: str(v) for k, v in paths.items()}

    tables = {}
    for step in outputs.TABLE_STEPS:
        assert run["printed"][step] == as_str(outputs.table_outputs(step, run["tables"])), step
        tables.update(outputs.table_outputs(step, run["tables"]))
    assert run["printed"]["figures"] == as_str(outputs.figure_outputs(run["figures"]))
    pairs = sorted(set(zip(run["data"]["cells"]["model"], run["data"]["cells"]["benchmark"])))
    assert len(pairs) == 15
    cards = outputs.card_outputs(run["cards"], pairs)
    assert run["printed"]["cards"] == as_str(cards)
    assert set(run["tables"].iterdir()) == set(tables.values())
    assert set(run["figures"].iterdir()) == set(outputs.figure_outputs(run["figures"]).values())
    assert set(run["cards"].iterdir()) == set(cards.values())


PRODUCER = {**dict.fromkeys(("table2", "table3", "table4", "parse_clean", "tau_r", "bootstrap", "nearest_reversal"),
                           "tables"),
            "anova": "variance", "shap": "variance", "robustness": "robustness",
            "robustness_regression": "robustness", "robustness_item_sd": "robustness",
            "robustness_item_sd_hist": "robustness", "subsample_stability": "subsample",
            "subsample_cells": "subsample", "subsample_rho_flip": "subsample", "precision": "precision",
            "precision_cells": "precision", "bbq_bias": "bbq_bias", "bbq_bias_summary": "bbq_bias",
            "significance": "significance", "significance_configs": "significance",
            "significance_benchmarks": "significance",
            "bootstrap_items": "significance", "scale_probe": "scale_probe", "scale_probe_pairs": "scale_probe"}
EXPECTED_ROWS = {"table2": 15, "table3": 39, "table4": 5 * 5, "parse_clean": 5, "tau_r": 10, "bootstrap": 20,
                 "nearest_reversal": 15, "subsample_rho_flip": 5 * 4 * 5, "bbq_bias": 3 * 48, "bbq_bias_summary": 3,
                 "anova": 5, "shap": 5 * (5 + 3 * 4), "robustness": 15, "robustness_regression": 1,
                 "robustness_item_sd": 15, "robustness_item_sd_hist": 15 * 15,
                 "subsample_stability": 5, "subsample_cells": 3 * (4 * 48 + 12), "precision": 6,
                 "precision_cells": 3 * 18, "significance": 15, "significance_configs": 3 * (4 * 48 + 12),
                 "significance_benchmarks": 5, "bootstrap_items": 20,
                 "scale_probe": 5, "scale_probe_pairs": 5}


def test_every_table_written_stamped_and_sized(run):
    src_meta = run["data"]["meta"]
    for name, n in EXPECTED_ROWS.items():
        p = run["tables"] / f"{name}.parquet"
        df = pd.read_parquet(p)
        assert len(df) == n, name
        assert len(pd.read_csv(run["tables"] / f"{name}.csv")) == n
        md = read_metadata(p)
        assert {k: md[k] for k in STAMP_KEYS} == {k: src_meta[k] for k in STAMP_KEYS}, name
        assert md["subset_hashes"] == src_meta["subset_hashes"] and md["table"] == name
        # stamped with the code of the analysis that computed it (what its rule fingerprints)
        assert md["producer"] == f"safetyrepro.analysis.{PRODUCER[name]}", name
        assert md["code_fingerprint"] == code_fingerprint(md["producer"]) and stale_reason(md) is None


def test_full_size_numbers_agree_with_the_metric_core(run):
    cells = load_cell_scores(run["data"]["cell_scores"]).df
    from safetyrepro.analysis.tables import FLIP_SUMMARY_COLUMNS, flip_summary

    full_summary = benchmark_summary(cells)
    pd.testing.assert_frame_equal(flip_summary(cells), full_summary[FLIP_SUMMARY_COLUMNS])
    tau = pd.read_parquet(run["tables"] / "tau_r.parquet").set_index(["benchmark", "envelope"])
    for r in full_summary.itertuples():
        assert tau.loc[(r.benchmark, "full"), "tau_r"] == pytest.approx(r.tau_r)
    t2 = pd.read_parquet(run["tables"] / "table2.parquet")
    ref = pairwise_table(cells)
    pd.testing.assert_series_equal(t2["rho_flip"], ref["rho_flip"])
    assert set(t2.loc[t2["benchmark"] == "crows_pairs", "n_configs"]) == {12}
    assert set(t2.loc[t2["benchmark"] != "crows_pairs", "n_configs"]) == {48}
    t4 = pd.read_parquet(run["tables"] / "table4.parquet").set_index(["benchmark", "envelope"])
    core = benchmark_summary(cells[cells["core"]]).set_index("benchmark")
    for b in core.index:
        assert t4.loc[(b, "core"), "orderings_reachable"] == core.loc[b, "orderings_reachable"]
        assert t4.loc[(b, "core"), "n_configs"] == (9 if b == "crows_pairs" else 27)
        # full minus T4: 3 of 4 templates; full minus t0.7: free-form loses 12 of 36 configs
        assert t4.loc[(b, "full minus T4"), "n_configs"] == (9 if b == "crows_pairs" else 36)
        assert t4.loc[(b, "full minus t0.7"), "n_configs"] == (12 if b == "crows_pairs" else 36)
        assert t4.loc[(b, "conservative_core"), "n_configs"] == (0 if b == "crows_pairs" else 4)
    for r in full_summary.itertuples():
        assert tau.loc[(r.benchmark, "full"), "order_change_rate"] == pytest.approx(r.order_change_rate)
    rev = pd.read_parquet(run["tables"] / "nearest_reversal.parquet")
    assert set(rev.loc[rev["benchmark"] != "crows_pairs", "nominal_used"]) == {"T1-greedy-k0-freeform"}
    assert set(rev.loc[rev["benchmark"] == "crows_pairs", "nominal_used"]) == {"T1-greedy-k0-logprob"}
    # a pair has a strict reversal within the envelope iff rho_flip > 0 or it is tied at the nominal
    t2i = t2.set_index(["benchmark", "model_a", "model_b"])
    for r in rev.itertuples():
        if r.nominal_leader != "tie":
            assert pd.isna(r.strict_distance) == (t2i.loc[(r.benchmark, r.model_a, r.model_b), "rho_flip"] == 0)
    # the noise columns of Table 2 are significance's (same streams and draws over the full envelope)
    sig = pd.read_parquet(run["tables"] / "significance.parquet").set_index(["benchmark", "model_a", "model_b"])
    for col in ("rho_flip_null_mean", "rho_flip_null_q95", "rho_flip_null_p"):
        assert t2i[col].to_dict() == sig.loc[t2i.index, col].to_dict(), col
    sb = pd.read_parquet(run["tables"] / "significance_benchmarks.parquet").set_index("benchmark")
    t2b = t2.drop_duplicates("benchmark").set_index("benchmark")
    assert (t2b["max_rho_flip_null_p"] == sb.loc[t2b.index, "max_rho_flip_null_p"]).all()
    assert (sb["max_rho_flip"] == t2b.loc[sb.index, "max_rho_flip"]).all()
    assert (t4["max_rho_flip_null_q95"].dropna() <= 0.5).all() and t4["orderings_null_mean"].notna().any()
    # every table that has rho_flip carries its noise reference
    for name, col in (("table3", "rho_flip_null_p"), ("parse_clean", "max_rho_flip_null_p"),
                      ("bootstrap", "rho_flip_null_p")):
        t = pd.read_parquet(run["tables"] / f"{name}.parquet")
        assert t[col].between(0, 1).all() and (t["noise_note"] == "").all(), name
    bt = pd.read_parquet(run["tables"] / "bootstrap.parquet").set_index(["benchmark", "statistic"])
    for b in sb.index:
        assert bt.loc[(b, "max"), "rho_flip_null_p"] == sb.loc[b, "max_rho_flip_null_p"]
    sub = pd.read_parquet(run["tables"] / "subsample_stability.parquet").set_index("benchmark")
    # the all-items noise reference of the max rho_flip is the significance table's (same stream)
    assert (sub.loc[sb.index, "max_rho_flip_null_q95_all_items"] == sb["max_rho_flip_null_q95"]).all()
    assert sub["max_rho_flip_null_q95_sub"].between(0, 0.5).all()
    srho = pd.read_parquet(run["tables"] / "subsample_rho_flip.parquet")
    assert srho["rho_flip_null_p"].between(0, 1).all() and (srho["rho_flip_null_q95"] <= 0.5).all()
    boot = pd.read_parquet(run["tables"] / "bootstrap.parquet")
    assert (boot["ci_low"] <= boot["ci_high"]).all() and set(boot["samples"]) == {200}
    anova = pd.read_parquet(run["tables"] / "anova.parquet").set_index("benchmark")
    ff = anova.drop("crows_pairs")
    assert ff["balanced"].all() and (ff["shares_sum"] - 1).abs().max() < 1e-9 and (ff["n_cells"] == 108).all()
    prec = pd.read_parquet(run["tables"] / "precision.parquet").set_index("benchmark")
    # the paper's 18 (benchmark, config) pairs: the bf16 set's logprob k0 cells outside CrowS-Pairs are ignored
    assert prec.loc["ALL", "n_cells_paired"] == 54 and prec.loc["ALL", "n_configs_paired"] == 18
    rob = pd.read_parquet(run["tables"] / "robustness.parquet").set_index("benchmark")
    assert (rob.drop("crows_pairs")["n_configs"] == 36).all() and (rob.loc["crows_pairs", "n_configs"] == 12).all()
    assert (rob.loc["crows_pairs", "nominal_used"] == "T1-greedy-k0-logprob").all()
    assert rob["consistency"].mean() > 10 * rob["baseline"].mean()  # items are consistently easy or hard


def test_figures_report_and_cards(run):
    from PIL import Image

    for name in ("rho_heatmap", "rho_significance", "orderings", "anova_shares", "shap_summary", "consistency", "item_sd"):
        p = run["figures"] / f"{name}.png"
        with Image.open(p) as im:
            assert im.size[0] > 600 and im.size[1] > 400
            stamp = json.loads(im.text["Description"])
        assert stamp["rules_stamp"] == run["data"]["meta"]["rules_stamp"]
        assert stamp["code_fingerprint"] == code_fingerprint("safetyrepro.analysis.figures")
    report = (run["root"] / "report.md").read_text()
    assert "not produced" not in report
    assert "every table was computed by the current code" in report and "STALE" not in report
    for heading in ("Table 2", "Table 3", "Table 4", "Parse-clean", "tau_R", "Spread of rho_flip", "subsamples",
                    "BF16 vs NF4", "ANOVA", "SHAP", "Robustness", "Nearest reversing configuration",
                    "BBQ bias scores"):
        assert f"## {heading}" in report or heading in report
    assert report.count("![") == 7 and "](../figures/" not in report
    assert "## Significance-aware verdicts" in report and "rho_flip_sig" in report
    head = report.split("## Headline: do the flips exceed item noise?")[1].split("## Table 2")[0]
    assert head.count("\n- ") == 5 and "two exchangeable models give" in head and "noise p" in report
    assert "| resamples |" in report and "| items |" in report and "| configurations |" in report
    assert "](figures/rho_heatmap.png)" in report
    index = json.loads((run["cards"] / "index.json").read_text())
    assert len(index["cards"]) == 15
    card = json.loads((run["cards"] / "alpha__bbq.json").read_text())
    assert len(card["comparisons"]) == 2 and card["envelope"]["n_configs"] == 48
    sig = pd.read_parquet(run["tables"] / "significance.parquet").set_index(["benchmark", "model_a", "model_b"])
    for c in card["comparisons"]:
        r = sig.loc[("bbq", "alpha", c["other"])]
        assert c["significance"]["rho_flip_sig"] == r["rho_flip_sig"]
        assert c["significance"]["n_ahead_sig"] == r["n_plus_sig"] and c["significance"]["pattern"] == r["pattern"]
    assert "rho_flip_sig" in (run["cards"] / "alpha__bbq.md").read_text()
    assert "noise p" in (run["cards"] / "alpha__bbq.md").read_text()
    assert c["significance"]["rho_flip_null_p"] == r["rho_flip_null_p"]
    prec = pd.read_parquet(run["tables"] / "precision.parquet").set_index("benchmark")
    assert card["precision_check"]["n_cells"] == 4
    assert card["precision_check"]["orderings_agree"] == prec.loc["bbq", "orderings_agree"]

    assert all(c["nearest_reversal"]["reference_config"] == "T1-greedy-k0-freeform" for c in card["comparisons"])
    assert "## Nearest reversing configuration" in (run["cards"] / "alpha__bbq.md").read_text()
    # the scale probe's line on each family member's card (alpha -> beta vs gamma), none on gamma's
    from safetyrepro.analysis.scale_probe import probe_line

    row = pd.read_parquet(run["tables"] / "scale_probe.parquet").set_index("benchmark").loc["bbq"]
    line = probe_line({"benchmark": "bbq", **row.to_dict()})
    assert card["scale_probe"] == [line] and json.loads((run["cards"] / "beta__bbq.json").read_text())["scale_probe"] == [line]
    assert json.loads((run["cards"] / "gamma__bbq.json").read_text())["scale_probe"] is None
    assert f"- {line}" in (run["cards"] / "alpha__bbq.md").read_text()
    # rho_flip is never called a "flip rate"; only the total-order change rate is named after the paper's term
    assert "flip rate" not in report.lower().replace('total-order "flip rate"', "")

def test_significance_tables_agree_with_table2_and_the_items(run):
    """rho_flip in the significance table is table 2's (same exact signs); significant configs
    are a subset of strict reversals; each config's difference is the cell-score difference."""
    t2 = pd.read_parquet(run["tables"] / "table2.parquet").set_index(["benchmark", "model_a", "model_b"])
    sig = pd.read_parquet(run["tables"] / "significance.parquet").set_index(["benchmark", "model_a", "model_b"])
    assert (t2["tie_rule"] == "exact").all() and (sig["tie_rule"] == "exact").all()
    for k, r in sig.iterrows():
        assert (r["n_plus"], r["n_minus"], r["rho_flip"]) == (t2.loc[k, "n_plus"], t2.loc[k, "n_minus"],
                                                              t2.loc[k, "rho_flip"])
        assert r["n_plus_sig"] <= r["n_plus"] and r["n_minus_sig"] <= r["n_minus"]
        assert r["rho_flip_sig"] <= r["rho_flip"]
    cfg = pd.read_parquet(run["tables"] / "significance_configs.parquet")
    cells = load_cell_scores(run["data"]["cell_scores"]).df.set_index(["model", "benchmark", "config"])["score"]
    sample = cfg.sample(40, random_state=0)
    for r in sample.itertuples():
        want = cells[(r.model_a, r.benchmark, r.config)] - cells[(r.model_b, r.benchmark, r.config)]
        assert r.diff == pytest.approx(want, abs=1e-12)
    # 40 items: more than 14 differ somewhere, so the sign flips are drawn (Monte Carlo)
    assert set(cfg["test"]) == {"sign_flip", "none (tie)"}
    assert (cfg["p_adj"] >= cfg["p_value"]).all() and (cfg["p_value"] >= 1 / (sig["samples"].max() + 1)).all()
    assert (cfg["significant"] == (cfg["p_adj"] <= 0.05)).all()
    boot = pd.read_parquet(run["tables"] / "bootstrap_items.parquet")
    assert set(boot["resamples"]) == {"items"} and (boot["ci_low"] <= boot["ci_high"]).all()
    assert set(pd.read_parquet(run["tables"] / "bootstrap.parquet")["resamples"]) == {"configurations"}


def test_scale_probe_agrees_with_the_metric_core_on_the_conservative_core(run):
    """alpha -> beta as a family, gamma the third model: the probe's counts recomputed from the
    cell scores and significance_configs directly; CrowS-Pairs has no conservative-core config."""
    from safetyrepro.rules import load_rules

    rules = load_rules()
    cells = load_cell_scores(run["data"]["cell_scores"]).df
    core = cells[[rules.in_sub_envelope("conservative_core", lv) for lv in cells[["template", "decoding", "shots",
                                                                                  "scoring"]].to_dict("records")]]
    probe = pd.read_parquet(run["tables"] / "scale_probe.parquet").set_index("benchmark")
    pairs = pd.read_parquet(run["tables"] / "scale_probe_pairs.parquet").set_index("benchmark")
    sig = pd.read_parquet(run["tables"] / "significance_configs.parquet")
    assert probe.loc["crows_pairs", "n_configs"] == 0 and pairs.loc["crows_pairs", "n_configs"] == 0
    expected_pairs = pairwise_table(core).set_index("benchmark")
    for b in ("truthfulqa", "bbq", "toxigen", "xstest"):
        w = core[core["benchmark"] == b].pivot(index="config", columns="model", values="score")
        assert len(w) == 4 and probe.loc[b, "third"] == "gamma"
        rev = ((w["alpha"] > w["gamma"]) & (w["beta"] < w["gamma"])) | ((w["alpha"] < w["gamma"]) & (w["beta"] > w["gamma"]))
        assert probe.loc[b, "n_reversed"] == int(rev.sum())
        assert probe.loc[b, "reversed_configs"] == ",".join(w.index[rev])
        e = expected_pairs[(expected_pairs["model_a"] == "alpha") & (expected_pairs["model_b"] == "beta")].loc[b]
        assert (pairs.loc[b, "n_plus"], pairs.loc[b, "n_minus"], pairs.loc[b, "rho_flip"]) == \
            (e["n_plus"], e["n_minus"], e["rho_flip"])
        s = sig[(sig["benchmark"] == b) & sig["config"].isin(w.index)].set_index(["model_a", "model_b", "config"])["ahead"]
        def sig_sign(m, c):  # +1: m significantly ahead of gamma, -1: gamma significantly ahead
            ahead = s[("alpha" if m == "alpha" else "beta", "gamma", c)]
            return 1 if ahead == m else -1 if ahead == "gamma" else 0
        srev = [c for c in w.index if sig_sign("alpha", c) * sig_sign("beta", c) < 0]
        assert probe.loc[b, "n_reversed_sig"] == len(srev)
    assert "## Scale probe" in (run["root"] / "report.md").read_text()
