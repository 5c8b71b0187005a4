"""ANOVA against a textbook two-factor design worked by hand; rho and SHAP on crafted grids."""

import math

import numpy as np
import pandas as pd
import pytest

from analysis_synth import hand_cells, write_hand
from safetyrepro import grid
from safetyrepro.analysis.variance import anova_shares, anova_table, shap_table, write_variance
from safetyrepro.io import read_metadata
from safetyrepro.rules import load_rules


def test_anova_balanced_two_factor_textbook():
    # Cells (n = 2 replicates):  a1b1: 3, 5   a1b2: 7, 9   a2b1: 6, 8   a2b2: 12, 14
    # grand mean 64/8 = 8; A means 6, 10; B means 5.5, 10.5; cell means 4, 8, 7, 13.
    # SS_A = 4*(6-8)^2 + 4*(10-8)^2 = 32
    # SS_B = 4*(5.5-8)^2 + 4*(10.5-8)^2 = 50
    # SS_AB = 2 * sum (cell - A - B + G)^2 = 2 * 4 * 0.5^2 = 2;  SS_within = 8 * 1^2 = 8
    # SS_total = 25+9+1+1+4+0+16+36 = 92 = 32 + 50 + 2 + 8
    # Main-effects model: residual = SS_AB + SS_within = 10.
    df = pd.DataFrame({"fa": ["a1"] * 4 + ["a2"] * 4,
                       "fb": ["b1", "b1", "b2", "b2"] * 2,
                       "y": [3, 5, 7, 9, 6, 8, 12, 14]})
    r = anova_shares(df, ("fa", "fb"), response="y")
    assert r["ss_total"] == pytest.approx(92)
    assert r["ss_fa"] == pytest.approx(32) and r["ss_fb"] == pytest.approx(50)
    assert r["ss_residual"] == pytest.approx(10)
    assert r["share_fa"] == pytest.approx(32 / 92) and r["share_residual"] == pytest.approx(10 / 92)
    assert r["shares_sum"] == pytest.approx(1.0) and r["balanced"]
    assert r["df_fa"] == 1 and r["df_fb"] == 1
    assert r["formula"] == "y ~ C(fa) + C(fb)"


def test_anova_unbalanced_and_constant_factor():
    df = pd.DataFrame({"fa": ["a1", "a1", "a2"], "fb": ["b1", "b1", "b1"], "y": [1.0, 2.0, 4.0]})
    r = anova_shares(df, ("fa", "fb"), response="y")
    assert not r["balanced"] and r["constant_factors"] == ["fb"] and r["ss_fb"] == 0.0
    # one factor: SS_A = 2*(1.5-7/3)^2 + (4-7/3)^2 = 25/6; total = 1/4+1/4... computed directly:
    y = np.array([1.0, 2.0, 4.0])
    assert r["ss_total"] == pytest.approx(((y - y.mean()) ** 2).sum())
    assert r["ss_fa"] == pytest.approx(2 * (1.5 - 7 / 3) ** 2 + (4 - 7 / 3) ** 2)
    flat = anova_shares(pd.DataFrame({"fa": ["a1", "a2"], "y": [1.0, 1.0]}), ("fa",), "y")
    assert flat["ss_total"] == 0 and math.isnan(flat["share_fa"])


def additive_grid():
    """score = model effect + template effect on every free-form config of bbq; noise-free."""
    rules = load_rules()
    m_eff = {"A": 0.0, "B": 0.1, "C": 0.2}
    t_eff = {"T1": 0.0, "T2": 0.1, "T3": 0.2, "T4": 0.3}
    rows = []
    for c in grid.configs(rules, "bbq", "full"):
        for m, e in m_eff.items():
            # logprob cells get a wild value: they must not enter the free-form ANOVA
            s = 0.3 + e + t_eff[c.template] if c.scoring == "freeform" else (5.0 if m == "A" else -5.0)
            rows.append((m, "bbq", c.id, s))
    for c in grid.configs(rules, "crows_pairs", "full"):
        rows += [(m, "crows_pairs", c.id, 0.5 + e) for m, e in m_eff.items()]
    return hand_cells(rows)


def test_anova_table_rho_on_additive_grid():
    t = anova_table(additive_grid()).set_index("benchmark")
    # 36 free-form configs x 3 models = 108 cells; each model level has 36 cells:
    # SS_model = 36 * ((-0.1)^2 + 0 + 0.1^2) = 0.72; each template level has 27 cells:
    # SS_template = 27 * (0.15^2 + 0.05^2 + 0.05^2 + 0.15^2) = 1.35; decoding, shots, residual 0.
    b = t.loc["bbq"]
    assert b["n_cells"] == 108 and bool(b["balanced"])
    assert b["ss_model"] == pytest.approx(0.72) and b["ss_template"] == pytest.approx(1.35)
    assert b["ss_decoding"] == pytest.approx(0, abs=1e-12) and b["ss_residual"] == pytest.approx(0, abs=1e-12)
    assert b["share_model"] == pytest.approx(0.72 / 2.07) and b["rho"] == pytest.approx(1.35 / 0.72)
    assert "C(model) + C(template) + C(decoding) + C(shots)" in b["formula"]
    assert "residual = all interactions" in b["note"]
    c = t.loc["crows_pairs"]
    assert c["n_cells"] == 0 and "no free-form" in c["note"] and math.isnan(c["rho"])


def sign_grid():
    """bbq, full envelope. A vs B: A ahead under T1/T2, behind under T3/T4 (template decides);
    A vs C and B vs C: C is always last (never flips)."""
    rules = load_rules()
    rng = np.random.default_rng(0)
    rows = []
    for c in grid.configs(rules, "bbq", "full"):
        base = rng.uniform(0.4, 0.6)
        a = base + (0.05 if c.template in ("T1", "T2") else -0.05)
        b = base
        rows += [("A", "bbq", c.id, a), ("B", "bbq", c.id, b), ("C", "bbq", c.id, base - 0.2)]
    return hand_cells(rows)


def test_shap_table_shape_axes_and_degenerate_pairs():
    t = shap_table(sign_grid())
    reg = t[t["target"] == "score"]
    assert list(reg["axis"]) == ["model", "template", "decoding", "shots", "scoring"]
    assert (reg["status"] == "ok").all() and reg["share"].sum() == pytest.approx(1.0)
    assert set(t["target"]) == {"score", "sign(A vs B)", "sign(A vs C)", "sign(B vs C)"}
    for target in ("sign(A vs B)", "sign(A vs C)", "sign(B vs C)"):
        assert list(t.loc[t["target"] == target, "axis"]) == ["template", "decoding", "shots", "scoring"]
    assert len(t) == 5 + 3 * 4
    ab = t[t["target"] == "sign(A vs B)"].set_index("axis")
    assert ab.loc["template", "share"] > 0.99 and ab["fit_value"].iloc[0] == 1.0
    assert ab["n_rows"].iloc[0] == 48 and ab["n_ties_dropped"].iloc[0] == 0
    ac = t[t["target"] == "sign(A vs C)"]
    assert (ac["status"] == "skipped").all() and ac["mean_abs_shap"].isna().all()
    assert ac["reason"].str.contains("never flips").all()
    bc = t[t["target"] == "sign(B vs C)"]
    assert (bc["n_ties_dropped"] == 0).all() and (bc["status"] == "skipped").all()
    assert bc["reason"].str.contains("B ahead in every non-tied config").all()


def test_shap_classifier_with_ties_and_single_level_axis():
    rules = load_rules()
    rows = []
    for i, c in enumerate(grid.configs(rules, "crows_pairs", "full")):  # logprob + greedy only
        d = {"k0": 0.1, "k3": -0.1, "k5": 0.0}[c.shots]
        rows += [("A", "crows_pairs", c.id, 0.5 + d), ("B", "crows_pairs", c.id, 0.5)]
    t = shap_table(hand_cells(rows))
    s = t[t["target"] == "sign(A vs B)"].set_index("axis")
    assert (s["n_ties_dropped"] == 4).all() and (s["n_rows"] == 8).all()
    assert s.loc["shots", "share"] == pytest.approx(1.0)
    assert math.isnan(s.loc["decoding", "share"]) and "single level" in s.loc["decoding", "reason"]
    assert s.loc["shots", "n_levels"] == 3 and s.loc["scoring", "n_levels"] == 1


def test_shap_is_deterministic():
    g = sign_grid()
    pd.testing.assert_frame_equal(shap_table(g), shap_table(g))


def test_write_variance(tmp_path):
    src = write_hand(additive_grid(), tmp_path / "cs.parquet")
    paths = write_variance(src, tmp_path / "out")
    assert set(paths) == {"anova", "anova_csv", "shap", "shap_csv"}
    md = read_metadata(paths["anova"])
    assert md["params"]["anova_formula"] == "score ~ C(model) + C(template) + C(decoding) + C(shots)"
    assert md["params"]["lightgbm"]["n_jobs"] == 1
    shap = pd.read_parquet(paths["shap"])
    reg = shap[(shap["benchmark"] == "bbq") & (shap["target"] == "score")].set_index("axis")
    # in the additive grid decoding and shots never matter; free-form vs logprob does
    assert reg.loc["decoding", "mean_abs_shap"] == pytest.approx(0, abs=1e-9)
    assert reg.loc["shots", "mean_abs_shap"] == pytest.approx(0, abs=1e-9)
