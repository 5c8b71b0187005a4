"""``results/report.md``: the report's tables in Markdown, for reading in a terminal.

Every section is read from the analysis tables in ``tables_dir`` (the stamped Parquet files);
a table that was not produced in this run is named as missing rather than silently left out.
Figures are linked relative to the report's location.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pandas as pd

from ..errors import DataError
from ..sysutil import atomic_write_text
from ..provenance import code_version_string
from ..metrics import reversal_line
from ..metrics.significance import headline_sentence
from .cards import PATTERN_WORDS as PATTERN_TEXT
from .common import read_table, stale_note, version_text
from ..textsafe import markdown_safe
from .outputs import REPORT_TABLES
from .scale_probe import probe_line




def _fmt(v, digits: int = 3) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if math.isnan(v):
            return "–"
        if v != 0 and abs(v) < 10 ** -digits:
            return f"{v:.1e}"
        return f"{v:.{digits}f}"
    try:
        if pd.isna(v):
            return "–"
    except (TypeError, ValueError):
        pass
    return markdown_safe(str(v).replace("\n", " "))   # names from input files stay text


def md_table(df: pd.DataFrame, columns: dict[str, str] | None = None, digits: int = 3) -> str:
    """A GitHub-flavoured Markdown table; ``columns`` maps source column -> header."""
    columns = columns or {c: c for c in df.columns}
    cols = [c for c in columns if c in df.columns]
    head = "| " + " | ".join(_fmt(columns[c]) for c in cols) + " |"
    sep = "|" + "|".join("---" for _ in cols) + "|"
    body = ["| " + " | ".join(_fmt(v.item() if hasattr(v, "item") else v, digits) for v in row) + " |"
            for row in df[cols].itertuples(index=False, name=None)]
    return "\n".join([head, sep, *body])


def _figure(figures_dir: Path, name: str, out_path: Path, alt: str) -> str:
    p = figures_dir / f"{name}.png"
    if not p.exists():
        return f"_figure `{name}.png` not produced in this run_"
    return f"![{alt}]({os.path.relpath(p, out_path.parent)})"


def build_report(tables_dir: str | Path, figures_dir: str | Path, out_path: str | Path) -> str:
    tables_dir, figures_dir, out_path = Path(tables_dir), Path(figures_dir), Path(out_path)
    if not tables_dir.is_dir():
        raise DataError(tables_dir, "tables folder not found")
    loaded = {name: read_table(tables_dir / f"{name}.parquet") for name in REPORT_TABLES
              if (tables_dir / f"{name}.parquet").exists()}
    if not loaded:
        raise DataError(tables_dir, f"none of the report's tables is here (expected e.g. {REPORT_TABLES[0]}.parquet)")

    stale = {name: note for name, (_, meta) in loaded.items() if (note := stale_note(name, meta))}

    def section(name: str, render) -> str:
        if name not in loaded:
            return f"_table `{name}` not produced in this run (expected {tables_dir / (name + '.parquet')})_"
        body = render(loaded[name][0])
        return f"**{stale[name]}**\n\n{body}" if name in stale else body

    first = next((loaded[n][1] for n in ("table2", "table4", "anova", "robustness") if n in loaded), {})
    cv = first.get("code_version", "?")
    out = ["# SafetyRepro report", "",
           f"- rules stamp: `{first.get('rules_stamp', '?')}`",
           f"- config hash: `{first.get('config_hash', '?')}`",
           f"- code version (run): `{version_text(cv)}`",
           f"- report code version: `{code_version_string()}`",
           ("- every table was computed by the current code (code fingerprints match)" if not stale else
            f"- **STALE tables ({len(stale)}): {', '.join(sorted(stale))}** — written by other code than the "
            "current one; their sections are marked, rerun the workflow"),
           f"- sources: {', '.join(sorted({s['path'] for _, m in loaded.values() for s in m.get('sources', [])}))}",
           "", "Model pairs are (A, B) with A < B by name; N+ counts configs where A scores higher, "
           "N- where B does, N0 ties. rho_flip = min(N+, N-)/|C|; its ceiling is floor(|C|/2)/|C|.", ""]

    out += ["## Headline: do the flips exceed item noise?", "",
            "rho_flip counts every strict reversal, however small; two models that are exchangeable on the items "
            "flip often too. Per benchmark: the largest rho_flip beside what two exchangeable models give on the "
            "same items (item-wise swaps of the models' scores, docs/VERDICTS.md), whether any pair reverses "
            "significantly both ways, and the difference a config needs to be detected.", ""]
    out.append(section("significance_benchmarks", lambda d: "\n".join(
        f"- {headline_sentence(r)}" for r in d.to_dict("records"))))
    out += ["", "## Table 2: verdict stability per benchmark and pair (full envelope)", "",
            "noise mean / q95 / p: rho_flip of two exchangeable models on the same items (p = share of such draws "
            "with at least the observed rho_flip); a small p means more flips than item noise gives.", ""]
    out.append(section("table2", lambda d: md_table(d, {
        "benchmark": "benchmark", "pair": "pair", "n_plus": "N+", "n_minus": "N-", "n_zero": "N0",
        "n_configs": "|C|", "rho_flip": "rho_flip", "rho_flip_null_mean": "noise mean",
        "rho_flip_null_q95": "noise q95", "rho_flip_null_p": "noise p", "ceiling": "ceiling",
        "saturated": "saturated", "d1": "D1", "d2": "D2", "max_rho_flip": "max over pairs",
        "max_rho_flip_null_p": "max: noise p", "orderings_reachable": "orderings",
        "orderings_null_mean": "orderings: noise mean", "noise_note": "note"})))
    out += ["", _figure(figures_dir, "rho_heatmap", out_path, "rho_flip heatmap"), ""]

    def sig_render(d: pd.DataFrame) -> str:
        d = d.assign(pair=[f"{a} vs {b}" for a, b in zip(d["model_a"], d["model_b"])],
                     pattern=[f"**{PATTERN_TEXT.get(p, p)}**" for p in d["pattern"]])
        alpha = float(d["alpha"].iloc[0]) if len(d) else float("nan")
        head = (f"alpha = {alpha:g} family-wise; family: {d['family'].iloc[0] if len(d) else '?'}; "
                f"{d['correction'].iloc[0] if len(d) else ''}; resampling: "
                f"{', '.join(sorted(set(d['resampling'])))}; seed {int(d['seed'].iloc[0]) if len(d) else 0}.\n\n")
        return head + md_table(d, {
            "benchmark": "benchmark", "pair": "pair", "n_configs": "|C|", "n_items": "items", "n_plus": "N+",
            "n_minus": "N-", "rho_flip": "rho_flip", "rho_flip_null_p": "noise p", "n_plus_sig": "N+_sig",
            "n_minus_sig": "N-_sig", "rho_flip_sig": "rho_flip_sig", "crossover_p": "crossover p",
            "mdd_median": "mdd (median)", "min_attainable_p": "smallest attainable p", "pattern": "pattern"})

    out += ["## Significance-aware verdicts (item level)", "",
            "Per config the two models are compared on the same items (a sampled cell's item score is its seed "
            "mean) by a sign-flip test: each item's pair of scores may be swapped, jointly over every config "
            "(exact over all 2^k swaps when k <= 14 items differ; for 0/1 items this is the exact McNemar test). "
            "The p-values are corrected over the family by step-down max-T on the same draws, so the per-config "
            "decisions, N+_sig / N-_sig, rho_flip_sig = min(N+_sig, N-_sig)/|C| and the crossover decision "
            "(significantly ahead somewhere AND behind somewhere) cannot contradict each other. mdd: the "
            "difference a config needs to be detected with 80% power; where even the most extreme data cannot "
            "reach alpha the table says so. Pattern: "
            + "; ".join(f"`{k}` = {v}" for k, v in PATTERN_TEXT.items()) + ".", ""]
    out.append(section("significance", sig_render))
    out += ["", _figure(figures_dir, "rho_significance", out_path, "rho_flip vs rho_flip_sig"), ""]

    out += ["## Table 3: scoring-path slices", "",
            "Logprob scoring exists only under greedy decoding, so the `freeform` and `logprob` slices are "
            "**not matched on decoding support**; `freeform_greedy` is the matched free-form slice. "
            "CrowS-Pairs has no free-form path.", ""]
    out.append(section("table3", lambda d: md_table(d, {
        "benchmark": "benchmark", "slice": "slice", "decoding_support": "decodings", "pair": "pair",
        "n_plus": "N+", "n_minus": "N-", "n_zero": "N0", "n_configs": "|C|", "rho_flip": "rho_flip",
        "rho_flip_null_p": "noise p", "max_rho_flip": "max over pairs", "orderings_reachable": "orderings",
        "matched_to_logprob_decoding": "matched to logprob"})))

    out += ["", "## Table 4: envelopes (full, core, full minus T4, full minus T=0.7, conservative core)", ""]
    out.append(section("table4", lambda d: md_table(d, {
        "benchmark": "benchmark", "envelope": "envelope", "n_configs": "|C|", "max_rho_flip": "max rho_flip",
        "max_pair": "pair", "max_rho_flip_null_q95": "noise q95", "max_rho_flip_null_p": "noise p",
        "orderings_reachable": "orderings reachable", "orderings_possible": "of",
        "orderings_null_mean": "orderings: noise mean", "orderings_null_p": "orderings: noise p",
        "tied_configs": "configs with ties", "note": "note"})))
    out += ["", _figure(figures_dir, "orderings", out_path, "orderings reachable per envelope"), ""]

    out += ["## Parse-clean recomputation", ""]
    out.append(section("parse_clean", lambda d: md_table(d, {
        "benchmark": "benchmark", "threshold": "min parse rate", "n_configs_total": "|C| full",
        "n_configs_left": "|C| left", "max_rho_flip": "max rho_flip", "max_pair": "pair",
        "max_rho_flip_null_q95": "noise q95", "max_rho_flip_null_p": "noise p",
        "orderings_reachable": "orderings", "max_rho_flip_full": "max rho_flip (full)", "note": "note"})))

    out += ["", "## tau_R and the total-order change rate", "",
            "tau_R: mean Kendall tau-b between the model rankings of two configs, over all config pairs. "
            "Total-order change rate: share of config pairs whose induced orders of the models differ "
            "(the paper's total-order \"flip rate\"; a property of the whole ranking, not rho_flip). "
            "Column `exchangeable bound`: 1 - 1/n!, its value only when every config's strict order is an "
            "independent uniform draw; it cannot tell instability from noise (a fixed order with 1 pp gaps plus "
            "item noise comes close to it). The reference measured on the run's items is in the headline's table "
            "(`significance_benchmarks`: order_change_null_*).", ""]
    out.append(section("tau_r", lambda d: md_table(d, {
        "benchmark": "benchmark", "envelope": "envelope", "n_configs": "|C|", "tau_r": "tau_R",
        "tau_pairs_used": "config pairs used", "tau_pairs_undefined": "undefined",
        "order_change_rate": "total-order change rate", "order_change_null": "exchangeable bound"})))

    out += ["", "## Spread of rho_flip under resampling (percentile 2.5-97.5)", "",
            "Two spreads, each labelled by what it resamples: `configurations` (items fixed: which configs "
            "happen to be in the envelope) and `items` (configs fixed: every cell recomputed on the same item "
            "redraws). Neither is a confidence interval for a 'true' rho_flip: item noise biases the plug-in "
            "value up, so read it against the noise references above.", ""]
    boot_cols = {"benchmark": "benchmark", "statistic": "rho_flip of", "resamples": "resamples",
                 "n_configs": "|C|", "estimate": "estimate", "ci_low": "2.5%", "ci_high": "97.5%",
                 "rho_flip_null_q95": "noise q95", "rho_flip_null_p": "noise p", "samples": "B", "seed": "seed"}
    out.append(section("bootstrap", lambda d: md_table(d, boot_cols)))
    out.append("")
    out.append(section("bootstrap_items", lambda d: md_table(d, boot_cols)))

    out += ["", "## Nearest reversing configuration", "",
            "Fewest axis changes (template, decoding, shots, scoring) from the nominal config to a valid config "
            "of the envelope where the other model is strictly (or significantly) ahead; docs/VERDICTS.md.", ""]
    out.append(section("nearest_reversal", lambda d: "\n".join(
        f"- {reversal_line(r)}" for r in d.to_dict("records"))))
    out += [""]
    out.append(section("nearest_reversal", lambda d: md_table(d.astype({"strict_distance": "Int64",
                                                                         "sig_distance": "Int64"}), {
        "benchmark": "benchmark", "pair": "pair", "nominal_used": "reference config", "nominal_leader": "ahead there",
        "strict_distance": "strict: axis changes", "strict_configs": "config(s)", "strict_axes": "axes",
        "n_strict_reversing": "configs reversing", "sig_distance": "significant: axis changes",
        "sig_configs": "config(s)"})))

    out += ["", "## Stratified item subsamples", ""]
    out.append(section("subsample_stability", lambda d: md_table(d, {
        "benchmark": "benchmark", "fraction": "fraction", "repeats": "repeats", "n_cells": "cells",
        "range_median": "median cell range", "range_max": "max cell range", "n_core_configs": "core configs",
        "ordering_change_rate": "ordering changed (share of config x repeat)",
        "configs_changed_any": "configs ever changed", "n_configs": "|C|",
        "max_rho_flip_all_items": "max rho_flip (all items)", "max_rho_flip_sub_min": "min over repeats",
        "max_rho_flip_sub_median": "median", "max_rho_flip_sub_max": "max",
        "max_rho_flip_null_q95_all_items": "noise q95 (all items)", "max_rho_flip_null_p_all_items": "noise p",
        "max_rho_flip_null_q95_sub": "noise q95 (subsample)", "noise_note": "note"})))
    out += ["", "rho_flip per pair on the subsamples (distribution over repeats; full envelope):", ""]

    def sub_rho(d: pd.DataFrame) -> str:
        g = d.groupby(["benchmark", "statistic"], sort=True)
        t = pd.DataFrame({"min": g["rho_flip"].min(), "median": g["rho_flip"].median(), "max": g["rho_flip"].max(),
                          "repeats": g.size()}).reset_index()
        if "rho_flip_null_p" in d.columns:   # the noise reference of each subsample, summarised over repeats
            t = t.merge(g[["rho_flip_null_q95", "rho_flip_null_p"]].median().reset_index(), on=["benchmark", "statistic"])
        t = t.merge(d.drop_duplicates(["benchmark", "statistic"])[["benchmark", "statistic", "rho_flip_all_items"]],
                    on=["benchmark", "statistic"])
        return md_table(t, {"benchmark": "benchmark", "statistic": "rho_flip of", "rho_flip_all_items": "all items",
                            "min": "min", "median": "median", "max": "max", "repeats": "repeats",
                            "rho_flip_null_q95": "noise q95 (median)", "rho_flip_null_p": "noise p (median)"})

    out.append(section("subsample_rho_flip", sub_rho))

    out += ["", "## BF16 vs NF4 (conservative_core; CrowS-Pairs T1/T2 zero-shot logprob)", ""]
    out.append(section("precision", lambda d: md_table(d, {
        "benchmark": "benchmark", "n_cells_paired": "paired cells", "abs_diff_median": "median |diff|",
        "abs_diff_mean": "mean |diff|", "abs_diff_max": "max |diff|", "orderings_agree": "orderings agree",
        "share_orderings_match": "share"})))

    out += ["", "## Variance attribution: ANOVA (free-form slice)", "",
            "Type II ANOVA of `score ~ C(model) + C(template) + C(decoding) + C(shots)` (main effects only; "
            "every interaction is in the residual). Shares are of the total SS; "
            "rho = (template + decoding + shots SS) / model SS.", ""]
    out.append(section("anova", lambda d: md_table(d, {
        "benchmark": "benchmark", "n_cells": "cells", "share_model": "model", "share_template": "template",
        "share_decoding": "decoding", "share_shots": "shots", "share_residual": "residual", "rho": "rho",
        "balanced": "balanced"})))
    out += ["", _figure(figures_dir, "anova_shares", out_path, "ANOVA shares"), ""]

    def shap_render(d: pd.DataFrame) -> str:
        w = d.pivot_table(index=["benchmark", "target"], columns="axis", values="share", aggfunc="first",
                          dropna=False, sort=False).reset_index()
        info = d.drop_duplicates(["benchmark", "target"])[["benchmark", "target", "n_rows", "n_ties_dropped",
                                                           "fit_metric", "fit_value", "status"]]
        w = w.merge(info, on=["benchmark", "target"], how="left")
        cols = {"benchmark": "benchmark", "target": "target"}
        cols.update({a: a for a in ("model", "template", "decoding", "shots", "scoring") if a in w.columns})
        cols.update({"n_rows": "rows", "n_ties_dropped": "ties dropped", "fit_value": "in-sample fit",
                     "status": "status"})
        return md_table(w, cols, 2)

    out += ["## Variance attribution: LightGBM surrogate + SHAP", "",
            "Share of mean |SHAP| per axis (one-hot columns summed back to their axis). The surrogate only "
            "localises which axis drives scores or flips; it is not a causal estimate. Sign classifiers drop "
            "tied configs; a pair that never flips gets no classifier (status `skipped`).", ""]
    out.append(section("shap", shap_render))
    out += ["", _figure(figures_dir, "shap_summary", out_path, "SHAP summary"), ""]

    out += ["## Robustness as task competence (free-form envelope; CrowS-Pairs logprob)", "",
            "Consistency (Ashury-Tahan et al. 2026): share of items answered correctly in every one of the m "
            "configs (seed 0; any correct label counts; a parse failure is not correct). Random baseline: p^m, "
            "p = the share correct at the nominal config (CrowS-Pairs: its nearest logprob config). Same answer: "
            "share with the identical parsed answer everywhere. Item SD: median over items of the SD of the item's "
            "score across the configs. Drop rate: mean (nominal - config) / nominal over the other configs.", ""]
    out.append(section("robustness", lambda d: md_table(d, {
        "model": "model", "benchmark": "benchmark", "n_configs": "configs", "n_items": "items",
        "consistency": "consistency", "performance": "p", "baseline": "random baseline",
        "answer_consistency": "same answer", "score_mean": "mean score", "score_sd": "SD",
        "item_sd_median": "item SD (median)", "nominal_score": "nominal", "drop_rate_mean": "drop rate",
        "share_below_nominal": "share below nominal"})))
    out += [""]
    out.append(section("robustness_regression", lambda d: md_table(d, {
        "y": "y", "x": "x", "n": "n", "slope": "slope", "intercept": "intercept", "r2": "R^2",
        "p_value": "p", "note": "note"})))
    out += ["", _figure(figures_dir, "consistency", out_path, "consistency vs performance")]
    out += ["", "Per-item score SD across configs, quantiles over items:", ""]
    out.append(section("robustness_item_sd", lambda d: md_table(d, {
        "model": "model", "benchmark": "benchmark", "n_items": "items", "mean": "mean", "q10": "10%",
        "q25": "25%", "q50": "median", "q75": "75%", "q90": "90%", "q100": "max", "share_zero": "share SD 0"})))
    out += ["", _figure(figures_dir, "item_sd", out_path, "per-item score SD"), ""]

    out += ["## BBQ bias scores (Parrish et al. 2022)", "",
            "Per model over the BBQ envelope: accuracy (the cell score) next to the bias scores. Disambiguated "
            "s_DIS = 2 n_biased / n_non-unknown - 1; ambiguous s_AMB = (1 - accuracy in ambiguous contexts) x the "
            "same ratio there. 0 = no preference for the biased answer, +1 = always it, -1 = always the other. "
            "Per config: `bbq_bias` table.", ""]
    out.append(section("bbq_bias_summary", lambda d: md_table(d, {
        "model": "model", "n_configs": "configs", "accuracy_mean": "mean accuracy",
        "bias_ambig_mean": "s_AMB mean", "bias_ambig_min": "min", "bias_ambig_max": "max",
        "bias_disambig_mean": "s_DIS mean", "bias_disambig_min": "min", "bias_disambig_max": "max"})))
    out += [""]
    if "cross_package" in loaded:
        out += cross_package_section(section, figures_dir, out_path)
    if "scale_probe" in loaded:
        out += scale_probe_section(section)
    return "\n".join(out) + "\n"


def scale_probe_section(section) -> list[str]:
    """The scale probe (docs/VERDICTS.md): a bounded statement per benchmark, family and third model."""
    out = ["## Scale probe: a larger sibling in place of a model", "",
           "Per benchmark: does swapping each family's small model for its large sibling reverse the verdict "
           "against a third model on some config of the sub-envelope (strict signs; significantly: both "
           "differences item-level significant in opposite directions)? Bounded: within this sub-envelope and "
           "on these items, not a scaling law.", ""]
    out.append(section("scale_probe", lambda d: "\n".join(f"- {probe_line(r)}" for r in d.to_dict("records"))))
    out += ["", "Small vs large directly, over the same configs (N+ = small ahead):", ""]
    out.append(section("scale_probe_pairs", lambda d: md_table(d, {
        "benchmark": "benchmark", "small": "small", "large": "large", "n_configs": "|C|", "n_plus": "N+",
        "n_minus": "N-", "n_zero": "N0", "rho_flip": "rho_flip", "n_plus_sig": "N+_sig", "n_minus_sig": "N-_sig",
        "rho_flip_sig": "rho_flip_sig", "note": "note"})))
    return out + [""]


def cross_package_section(section, figures_dir: Path, out_path: Path) -> list[str]:
    """The nominal configuration in other packages (docs/CROSS_PACKAGE.md)."""
    out = ["## The nominal configuration in other packages", "",
           "The same items and model folders scored by SafetyRepro's nominal cells, lm-evaluation-harness "
           "(its own task definitions, local data) and Inspect (multiple_choice + choice). Each package scores "
           "a different object (prompt format, candidates, rule: docs/CROSS_PACKAGE.md). Agreement: share of "
           "items where the package picks the option SafetyRepro's nominal free-form cell picks. Spread: max - "
           "min over packages (percentage points), per model and its max over models. Precision: the weights' "
           "precision of each row (the nominal configuration is compared in bf16; SafetyRepro's rows are the bf16 "
           "precision check's nominal cells where the run has them, else the run's own cells in its quantization). "
           "Compute: the arithmetic the row ran in (float32 on a CPU without native bf16, for every package).", ""]
    out.append(section("cross_package", lambda d: md_table(d, {
        "benchmark": "benchmark", "model": "model", "package": "package", "version": "version",
        "precision": "precision", "compute": "compute", "score": "score", "n_items": "items", "agreement": "agreement", "spread_model_pp": "spread (pp)",
        "spread_pp": "benchmark spread (pp)", "ordering_changes": "ordering changes",
        "prompt_sha256": "prompt sha256"})))
    out += ["", _figure(figures_dir, "cross_package", out_path, "scores per package"), ""]
    return out


def write_report_md(tables_dir: str | Path, figures_dir: str | Path, out_path: str | Path) -> Path:
    out_path = Path(out_path)
    atomic_write_text(out_path, build_report(tables_dir, figures_dir, out_path))
    return out_path
