"""Variance attribution: how much of the score variation is the model, how much the harness.

:func:`anova_table` (statsmodels, free-form slice) gives each axis' share of the total sum of
squares and rho = harness SS / model SS; :func:`shap_table` (a LightGBM surrogate explained by
SHAP) localises which axis drives scores and each pair's sign. The surrogate only localises:
it is not a causal estimate or a model to trust out of sample.
"""

from __future__ import annotations

import itertools
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from ..metrics.compare import ScoreGrid, diff_sign, score_grid
from .common import AXES, load_cell_scores, output_metadata, pair_label, write_tables

ANOVA_FACTORS = ("model", "template", "decoding", "shots")
ANOVA_FORMULA = "score ~ C(model) + C(template) + C(decoding) + C(shots)"
ANOVA_NOTE = ("Type II ANOVA of the main-effects model " + ANOVA_FORMULA +
              "; residual = all interactions + noise; shares = SS / SS_total")
SURROGATE_NOTE = ("surrogate localises which axis drives scores/flips; not causal, not a "
                  "validated predictor")
SHAP_COLUMNS = ["benchmark", "target", "model_a", "model_b", "axis", "n_levels", "mean_abs_shap",
                "share", "n_rows", "n_ties_dropped", "fit_metric", "fit_value", "status", "reason"]


def anova_shares(df: pd.DataFrame, factors=ANOVA_FACTORS, response: str = "score") -> dict:
    """Main-effects Type II ANOVA of ``response`` on categorical ``factors``.

    Returns n, ss_total, per factor ss/share/df (factors with one level: ss 0 and listed in
    ``constant_factors``), ss_residual, share_residual, shares_sum, balanced and formula."""
    import statsmodels.api as sm  # deferred: statsmodels, ANOVA only
    import statsmodels.formula.api as smf  # deferred: statsmodels, ANOVA only

    data = df[[response, *factors]].copy()
    for f in factors:
        data[f] = data[f].astype(str)
    y = data[response].to_numpy(dtype=float)
    ss_total = float(np.sum((y - y.mean()) ** 2))
    varying = [f for f in factors if data[f].nunique() > 1]
    constant = [f for f in factors if f not in varying]
    formula = f"{response} ~ " + (" + ".join(f"C({f})" for f in varying) if varying else "1")
    counts = data.groupby(varying).size() if varying else pd.Series([len(data)])
    n_combos = int(np.prod([data[f].nunique() for f in varying])) if varying else 1
    balanced = bool(len(counts) == n_combos and counts.nunique() == 1)
    out = {"n": len(data), "ss_total": ss_total, "formula": formula, "balanced": balanced,
           "constant_factors": constant}
    if ss_total == 0 or not varying:
        for f in factors:
            out[f"ss_{f}"] = 0.0
            out[f"share_{f}"] = float("nan")
            out[f"df_{f}"] = 0
        out.update(ss_residual=0.0, share_residual=float("nan"), shares_sum=float("nan"))
        return out
    fit = smf.ols(formula, data=data).fit()
    aov = sm.stats.anova_lm(fit, typ=2)
    for f in factors:
        key = f"C({f})"
        ss = float(aov.loc[key, "sum_sq"]) if key in aov.index else 0.0
        out[f"ss_{f}"] = ss
        out[f"share_{f}"] = ss / ss_total
        out[f"df_{f}"] = int(aov.loc[key, "df"]) if key in aov.index else 0
    out["ss_residual"] = float(aov.loc["Residual", "sum_sq"])
    out["share_residual"] = out["ss_residual"] / ss_total
    out["shares_sum"] = sum(out[f"share_{f}"] for f in factors) + out["share_residual"]
    return out


def anova_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per benchmark, on the free-form slice (CrowS-Pairs: a row with a note): the OLS
    main-effects model ``score ~ C(model) + C(template) + C(decoding) + C(shots)`` and its Type
    II ANOVA. Interactions and replicate noise fall into the residual. Shares are SS_term /
    SS_total; they sum to 1 only in a balanced design (``shares_sum``, ``balanced``). rho =
    (SS_template + SS_decoding + SS_shots) / SS_model. A single-level factor is left out
    (share 0, with a note)."""
    rows = []
    for b in sorted(df["benchmark"].unique()):
        sub = df[(df["benchmark"] == b) & (df["scoring"] == "freeform")]
        row = {"benchmark": b, "slice": "freeform"}
        if sub.empty:
            row.update(n_cells=0, note="no free-form configs (validity rules): no ANOVA")
            rows.append(row)
            continue
        r = anova_shares(sub, ANOVA_FACTORS)
        row.update(n_cells=r["n"], ss_total=r["ss_total"])
        for f in ANOVA_FACTORS:
            row[f"ss_{f}"] = r[f"ss_{f}"]
            row[f"share_{f}"] = r[f"share_{f}"]
        row.update(ss_residual=r["ss_residual"], share_residual=r["share_residual"],
                   shares_sum=r["shares_sum"], balanced=r["balanced"])
        harness = r["ss_template"] + r["ss_decoding"] + r["ss_shots"]
        row["rho"] = harness / r["ss_model"] if r["ss_model"] > 0 else float("nan")
        notes = [ANOVA_NOTE]
        if r["constant_factors"]:
            notes.append(f"single-level factor(s) left out: {', '.join(r['constant_factors'])}")
        if r["ss_model"] == 0:
            notes.append("SS_model = 0: rho undefined")
        if not r["balanced"]:
            notes.append("unbalanced design: Type II shares need not sum to 1")
        row["formula"] = r["formula"]
        row["note"] = "; ".join(notes)
        rows.append(row)
    cols = (["benchmark", "slice", "n_cells", "ss_total"]
            + [f"ss_{f}" for f in ANOVA_FACTORS] + ["ss_residual"]
            + [f"share_{f}" for f in ANOVA_FACTORS] + ["share_residual", "shares_sum", "rho",
                                                       "balanced", "formula", "note"])
    return pd.DataFrame(rows, columns=cols)


# ----------------------------------------------------------------------------- surrogate

def lgb_params(seed: int = 0) -> dict:
    return dict(n_estimators=200, learning_rate=0.1, num_leaves=7, min_child_samples=1,
                min_child_weight=1e-5, min_data_in_bin=1, subsample=1.0, colsample_bytree=1.0,
                n_jobs=1, random_state=seed, deterministic=True, force_col_wise=True, verbose=-1)


def one_hot(df: pd.DataFrame, axes) -> tuple[pd.DataFrame, dict[str, list[str]]]:
    """One-hot columns ``axis=level`` for the axes with >1 level; axis -> its columns."""
    cols: dict[str, list[str]] = {}
    parts = []
    for a in axes:
        levels = sorted(df[a].astype(str).unique())
        if len(levels) < 2:
            continue
        names = [f"{a}={lv}" for lv in levels]
        parts.append(pd.DataFrame({n: (df[a].astype(str) == lv).astype(float).to_numpy()
                                   for n, lv in zip(names, levels)}))
        cols[a] = names
    X = pd.concat(parts, axis=1) if parts else pd.DataFrame(index=range(len(df)))
    return X, cols


def axis_shap(shap_values: np.ndarray, X: pd.DataFrame, cols: dict[str, list[str]]) -> dict[str, float]:
    """Mean over rows of |sum of an axis's one-hot SHAP values|, per axis."""
    sv = np.asarray(shap_values)
    if sv.ndim == 3:  # (n, p, classes): take the positive class
        sv = sv[:, :, -1]
    pos = {c: i for i, c in enumerate(X.columns)}
    return {a: float(np.mean(np.abs(sv[:, [pos[c] for c in names]].sum(axis=1))))
            for a, names in cols.items()}


def _shap_values(model, X: pd.DataFrame) -> np.ndarray:
    import shap  # deferred: shap, attribution only

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sv = shap.TreeExplainer(model).shap_values(X)
    if isinstance(sv, list):
        sv = sv[-1]
    return np.asarray(sv)


def _rows(base: dict, axes, levels: dict[str, int], values: dict[str, float] | None,
          reason: str = "") -> list[dict]:
    rows = []
    total = sum(values.values()) if values else 0.0
    for a in axes:
        r = dict(base, axis=a, n_levels=levels[a])
        if values is None:
            r.update(mean_abs_shap=float("nan"), share=float("nan"), status="skipped", reason=reason)
        elif a not in values:
            r.update(mean_abs_shap=float("nan"), share=float("nan"), status="ok",
                     reason="axis has a single level here: cannot drive anything")
        else:
            r.update(mean_abs_shap=values[a], share=values[a] / total if total > 0 else float("nan"),
                     status="ok", reason=SURROGATE_NOTE)
        rows.append(r)
    return rows


def fit_regressor(sub: pd.DataFrame, seed: int = 0) -> tuple[dict[str, float] | None, float, str]:
    """(axis -> mean |SHAP|, in-sample R^2, reason-if-skipped) for one benchmark."""
    import lightgbm as lgb  # deferred: lightgbm, attribution only

    axes = ("model", *AXES)
    X, cols = one_hot(sub, axes)
    y = sub["score"].to_numpy(dtype=float)
    if X.shape[1] == 0 or np.all(y == y[0]):
        return None, float("nan"), "scores constant or no varying axis: nothing to attribute"
    model = lgb.LGBMRegressor(**lgb_params(seed)).fit(X, y)
    pred = model.predict(X)
    r2 = 1.0 - np.sum((y - pred) ** 2) / np.sum((y - y.mean()) ** 2)
    return axis_shap(_shap_values(model, X), X, cols), float(r2), ""


def fit_sign_classifier(grid: ScoreGrid, levels: pd.DataFrame, a: str, b: str, tol: float | None = None,
                        seed: int = 0) -> tuple[dict[str, float] | None, float, int, int, str]:
    """(axis -> mean |SHAP|, in-sample accuracy, n_rows, n_ties, reason-if-skipped).
    Signs and ties are :func:`safetyrepro.metrics.compare.diff_sign`'s."""
    import lightgbm as lgb  # deferred: lightgbm, attribution only

    sign = diff_sign(grid.column(a), grid.column(b), tol)
    keep = sign != 0
    n_ties = int((~keep).sum())
    y = (sign[keep] > 0).astype(int)
    lv = levels.loc[[c for c, k in zip(grid.configs, keep) if k]].reset_index(drop=True)
    if len(y) == 0:
        return None, float("nan"), 0, n_ties, "every config ties: no sign to classify"
    if len(np.unique(y)) < 2:
        ahead = a if y[0] == 1 else b
        return (None, float("nan"), len(y), n_ties,
                f"single sign class ({ahead} ahead in every non-tied config): the pair never flips, no classifier")
    X, cols = one_hot(lv, AXES)
    if X.shape[1] == 0:
        return None, float("nan"), len(y), n_ties, "no varying axis"
    model = lgb.LGBMClassifier(**lgb_params(seed)).fit(X, y)
    acc = float(np.mean(model.predict(X) == y))
    return axis_shap(_shap_values(model, X), X, cols), acc, len(y), n_ties, ""


def shap_table(df: pd.DataFrame, tol: float = 0.0, seed: int = 0) -> pd.DataFrame:
    """Per benchmark over the full envelope: a LightGBM regressor of the cell score on one-hot
    axes plus the model, and per pair (A < B) a classifier of sign(score_A - score_B) on the
    one-hot axes with tied configs (:mod:`safetyrepro.metrics.compare`) dropped and counted; a
    pair with one sign class left gets NaN and the reason. An axis' contribution is the sum of
    its one-hot columns' ``TreeExplainer`` SHAP values; the table reports the mean absolute
    value and its share. Single-level axes are NaN with a note. Trees are deterministic
    (``seed``, one thread) and may have tiny leaves, as the data are tiny."""
    rows: list[dict] = []
    for b in sorted(df["benchmark"].unique()):
        sub = df[df["benchmark"] == b].reset_index(drop=True)
        reg_axes = ("model", *AXES)
        nlev = {a: int(sub[a].nunique()) for a in reg_axes}
        values, r2, reason = fit_regressor(sub, seed)
        base = {"benchmark": b, "target": "score", "model_a": "", "model_b": "", "n_rows": len(sub),
                "n_ties_dropped": 0, "fit_metric": "in_sample_r2", "fit_value": r2}
        rows += _rows(base, reg_axes, nlev, values, reason)
        grid = score_grid(sub, b)
        levels = sub.drop_duplicates("config").set_index("config")[list(AXES)]
        for a, m in itertools.combinations(grid.models, 2):
            vals, acc, n, ties, reason = fit_sign_classifier(grid, levels, a, m, tol, seed)
            base = {"benchmark": b, "target": f"sign({pair_label(a, m)})", "model_a": a, "model_b": m,
                    "n_rows": n, "n_ties_dropped": ties, "fit_metric": "in_sample_accuracy",
                    "fit_value": acc}
            rows += _rows(base, AXES, {k: nlev[k] for k in AXES}, vals, reason)
    return pd.DataFrame(rows, columns=SHAP_COLUMNS)


def variance_tables(df: pd.DataFrame, tol: float = 0.0, seed: int = 0) -> dict[str, pd.DataFrame]:
    return {"anova": anova_table(df), "shap": shap_table(df, tol, seed)}


def write_variance(cell_scores_path: str | Path, out_dir: str | Path, *, tol: float = 0.0,
                   seed: int = 0) -> dict[str, Path]:
    """ANOVA and SHAP tables from ``cell_scores.parquet`` -> ``anova`` and ``shap`` (.parquet/.csv)."""
    cs = load_cell_scores(cell_scores_path)
    tables = variance_tables(cs.df, tol, seed)
    params = {"tol": tol, "seed": seed, "anova_formula": ANOVA_FORMULA, "lightgbm": lgb_params(seed)}
    return write_tables("variance", tables, out_dir, lambda name: output_metadata(
        name, [(cs.path, cs.meta)], params, {"dropped_incomplete_configs": cs.dropped}))
