"""Figures of the report, drawn from the analysis tables (matplotlib, Agg backend).

One PNG per entry of :data:`.outputs.FIGURES` (rho_flip heatmap and significance, orderings,
ANOVA shares, SHAP summary, consistency, item SDs). Each carries its source tables'
provenance and its own code stamp in its text metadata and is written atomically; a figure
drawn from a table written by other code says STALE in a corner and in that metadata.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import DataError
from ..sysutil import atomic_write_bytes
from ..provenance import code_stamp, code_version_string, stale_reason
from .common import read_table, source_record
from .outputs import FIGURES, figure_outputs

ANOVA_PARTS = [("share_model", "model"), ("share_template", "template"), ("share_decoding", "decoding"),
               ("share_shots", "shots"), ("share_residual", "residual (interactions + noise)")]
SHAP_AXES = ["model", "template", "decoding", "shots", "scoring"]


def _plt():
    import matplotlib  # deferred: matplotlib; Agg set before pyplot loads

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # deferred: after matplotlib.use("Agg")

    plt.rcParams.update({"font.size": 10, "axes.titlesize": 11, "figure.dpi": 100})
    return plt


def _save(fig, path: Path, meta: dict) -> Path:
    buf = io.BytesIO()
    stamp = {k: meta.get(k) for k in ("rules_stamp", "config_hash", "code_version")}
    stamp["analysis_code_version"] = code_version_string()
    stamp |= code_stamp(__name__)
    stamp["sources"] = [source_record(meta.get("table", "?"), meta)]
    stamp["stale"] = stale_reason(meta)  # the table drawn was written by other code
    if stamp["stale"]:
        fig.text(0.01, 0.005, f"STALE table: {stamp['stale']}", color="#b00000", fontsize=7, va="bottom",
                 wrap=True)
    fig.savefig(buf, format="png", dpi=150, bbox_inches="tight",
                metadata={"Software": "safetyrepro", "Description": json.dumps(stamp, sort_keys=True)})
    atomic_write_bytes(path, buf.getvalue())
    return path


def _annotated_heatmap(ax, data: pd.DataFrame, vmin: float, vmax: float, cmap: str, fmt: str = "{:.2f}"):
    arr = data.to_numpy(dtype=float)
    masked = np.ma.masked_invalid(arr)
    cm = __import__("matplotlib").colormaps[cmap].copy()
    cm.set_bad("#dddddd")
    im = ax.imshow(masked, vmin=vmin, vmax=vmax, cmap=cm, aspect="auto")
    ax.set_xticks(range(arr.shape[1]), labels=list(data.columns), rotation=30, ha="right")
    ax.set_yticks(range(arr.shape[0]), labels=list(data.index))
    for i in range(arr.shape[0]):
        for j in range(arr.shape[1]):
            v = arr[i, j]
            if np.isfinite(v):
                dark = (v - vmin) / (vmax - vmin or 1) > 0.6
                ax.text(j, i, fmt.format(v), ha="center", va="center", fontsize=8,
                        color="white" if dark else "black")
            else:
                ax.text(j, i, "n/a", ha="center", va="center", fontsize=7, color="#666666")
    return im


def rho_heatmap(t2: pd.DataFrame, meta: dict, path: Path) -> Path:
    """``rho_heatmap.png``: rho_flip per benchmark (rows) and model pair (columns) plus the max."""
    plt = _plt()
    mat = t2.pivot(index="benchmark", columns="pair", values="rho_flip")
    mat["max over pairs"] = t2.groupby("benchmark")["max_rho_flip"].first()
    fig, ax = plt.subplots(figsize=(1.3 * mat.shape[1] + 2.5, 0.55 * mat.shape[0] + 1.8))
    im = _annotated_heatmap(ax, mat, 0.0, 0.5, "viridis", "{:.3f}")
    fig.colorbar(im, ax=ax, label="rho_flip (ceiling 0.5)")
    ax.set_title("rho_flip = min(N+, N-)/|C| per model pair over the full envelope")
    ax.set_xlabel("model pair")
    ax.set_ylabel("benchmark")
    fig.tight_layout()
    out = _save(fig, path, meta)
    plt.close(fig)
    return out


PATTERN_STYLE = {   # pattern -> (colour of the rho_flip_sig bar, hatch of the rho_flip bar, label)
    "stable": ("#bbbbbb", "", "stable: no strict reversal"),
    "noise": ("#bbbbbb", "////", "reversals all within item noise"),
    "one_sided": ("#ee7733", "", "significant in one direction only"),
    "crossover": ("#cc3311", "", "significant reversals both ways"),
}


def rho_significance_chart(sig: pd.DataFrame, boot: pd.DataFrame, meta: dict, path: Path) -> Path:
    """``rho_significance.png``: per benchmark and pair, rho_flip beside rho_flip_sig and its
    item-bootstrap interval, coloured by pattern, so reversals within noise look different
    from significant reversals both ways."""
    plt = _plt()
    from matplotlib.patches import Patch  # deferred: matplotlib, loaded by _plt()

    d = sig.sort_values(["benchmark", "model_a", "model_b"]).reset_index(drop=True)
    bi = boot[boot["statistic"] != "max"].set_index(["benchmark", "model_a", "model_b"])
    y = np.arange(len(d))
    fig, ax = plt.subplots(figsize=(9, 0.42 * len(d) + 2.2))
    h = 0.38
    for i, r in d.iterrows():
        colour, hatch, _ = PATTERN_STYLE.get(r["pattern"], ("#999999", "", r["pattern"]))
        ax.barh(i - h / 2, r["rho_flip"], h, color=colour, alpha=0.35, edgecolor="#333333", hatch=hatch, lw=0.8)
        ax.barh(i + h / 2, r["rho_flip_sig"], h, color=colour, edgecolor="#333333", lw=0.8)
        key = (r["benchmark"], r["model_a"], r["model_b"])
        if key in bi.index:
            lo, hi = float(bi.loc[key, "ci_low"]), float(bi.loc[key, "ci_high"])
            ax.plot([lo, hi], [i - h / 2] * 2, color="#000000", lw=1.2)
        # the noise reference: 95% of exchangeable-model draws lie left of the tick
        ax.plot([r["rho_flip_null_q95"]] * 2, [i - h, i], color="#0077bb", lw=2.2)
        ax.text(0.515, i, f"{r['rho_flip']:.2f} / {r['rho_flip_sig']:.2f}  noise p={r['rho_flip_null_p']:.2g}  "
                f"p_cross={r['crossover_p']:.2g}\n"
                f"{PATTERN_STYLE.get(r['pattern'], ('', '', r['pattern']))[2]}", va="center", fontsize=7)
    ax.set_yticks(y, labels=[f"{r.benchmark}: {r.model_a} vs {r.model_b}" for r in d.itertuples()])
    ax.invert_yaxis()
    ax.set_xlim(0, 0.8)
    ax.axvline(0.5, color="grey", ls="--", lw=1)
    ax.set_xlabel("share of configs (ceiling 0.5)")
    alpha = float(d["alpha"].iloc[0]) if len(d) else float("nan")
    ax.set_title("rho_flip (upper, light bar; black line: spread under item redraws; blue tick: 95th percentile "
                 "of two\nexchangeable models) vs rho_flip_sig (lower, filled; reversals significant on the items "
                 f"at family-wise alpha={alpha:g})", fontsize=9)
    from matplotlib.lines import Line2D  # deferred: matplotlib, loaded by _plt()

    handles = [Patch(facecolor=c, edgecolor="#333333", hatch=hh, label=lab) for c, hh, lab in PATTERN_STYLE.values()]
    handles.append(Line2D([0], [0], color="#0077bb", lw=2.2, label="noise: 95% of exchangeable-model rho_flip"))
    ax.legend(handles=handles, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=3, frameon=False)
    fig.tight_layout()
    out = _save(fig, path, meta)
    plt.close(fig)
    return out


def orderings_chart(t4: pd.DataFrame, meta: dict, path: Path) -> Path:
    """``orderings.png``: orderings reachable (of n!) and max rho_flip on Table 4's envelopes."""
    plt = _plt()
    benches = sorted(t4["benchmark"].unique())
    envs = list(dict.fromkeys(t4["envelope"]))
    x = np.arange(len(benches))
    w = 0.8 / len(envs)
    palette = ["#4477aa", "#ee7733", "#228833", "#ccbb44", "#aa3377", "#66ccee", "#bbbbbb"]
    colors = {e: palette[i % len(palette)] for i, e in enumerate(envs)}
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.4))
    possible = int(t4["orderings_possible"].max())
    for k, e in enumerate(envs):
        sub = t4[t4["envelope"] == e].set_index("benchmark").reindex(benches)
        if "n_configs" in sub:  # an envelope without configs on a benchmark has no value to draw: n/a
            sub.loc[sub["n_configs"] == 0, ["orderings_reachable", "max_rho_flip"]] = np.nan
        for ax, col in zip(axes, ("orderings_reachable", "max_rho_flip")):
            bars = ax.bar(x + (k - (len(envs) - 1) / 2) * w, sub[col].to_numpy(dtype=float), w,
                          label=f"{e} envelope", color=colors[e])
            top = possible * 1.12 if col == "orderings_reachable" else 0.56
            for bar, v in zip(bars, sub[col].to_numpy(dtype=float)):
                text = "n/a" if not np.isfinite(v) else (f"{v:.0f}" if col == "orderings_reachable" else f"{v:.2f}")
                low = not np.isfinite(v) or v < 0.12 * top
                ax.text(bar.get_x() + bar.get_width() / 2, (v if np.isfinite(v) else 0) + 0.01 * top if low
                        else v / 2, text, ha="center", va="bottom" if low else "center",
                        fontsize=8 if len(envs) <= 2 else 6, color="black" if low else "white",
                        rotation=0 if len(envs) <= 2 else 90)
    axes[0].axhline(possible, color="grey", ls="--", lw=1)
    axes[0].text(len(benches) - 0.5, possible, f"all {possible} orders", va="bottom", ha="right",
                 fontsize=8, color="grey")
    axes[0].set_ylim(0, possible * 1.12)
    axes[0].set_ylabel(f"orderings reachable (of {possible})")
    axes[0].set_title("Distinct model orderings induced by some config")
    axes[1].axhline(0.5, color="grey", ls="--", lw=1)
    axes[1].text(len(benches) - 0.5, 0.5, "ceiling 0.5", va="bottom", ha="right", fontsize=8, color="grey")
    axes[1].set_ylim(0, 0.56)
    axes[1].set_ylabel("max rho_flip over pairs")
    axes[1].set_title("Largest rho_flip over model pairs")
    for ax in axes:
        ax.set_xticks(x, labels=benches, rotation=20, ha="right")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.tight_layout()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(envs), 5), fontsize=9, frameon=False,
               bbox_to_anchor=(0.5, -0.08))
    out = _save(fig, path, meta)
    plt.close(fig)
    return out


def anova_chart(anova: pd.DataFrame, meta: dict, path: Path) -> Path:
    """``anova_shares.png``: stacked shares of the total SS per benchmark (free-form ANOVA)."""
    plt = _plt()
    a = anova.sort_values("benchmark").reset_index(drop=True)
    fig, ax = plt.subplots(figsize=(9, 0.6 * len(a) + 2.2))
    left = np.zeros(len(a))
    colors = ["#4477aa", "#66ccee", "#228833", "#ccbb44", "#bbbbbb"]
    text_colors = ["white", "black", "white", "black", "black"]
    y = np.arange(len(a))
    for (col, label), c, tc in zip(ANOVA_PARTS, colors, text_colors):
        vals = a[col].to_numpy(dtype=float)
        vals = np.where(np.isfinite(vals), vals, 0.0)
        ax.barh(y, vals, left=left, color=c, label=label, edgecolor="white")
        for i, v in enumerate(vals):
            if v >= 0.06:
                ax.text(left[i] + v / 2, i, f"{v:.2f}", ha="center", va="center", fontsize=8, color=tc)
        left += vals
    for i, r in a.iterrows():
        if not np.isfinite(r.get("ss_total", np.nan)) or r.get("n_cells", 0) == 0:
            ax.text(0.01, i, "no free-form configs: no ANOVA", va="center", fontsize=8, color="#555555")
        else:
            rho = r["rho"]
            ax.text(1.01, i, f"rho = {rho:.2f}" if np.isfinite(rho) else "rho n/a", va="center", fontsize=8)
    ax.set_yticks(y, labels=a["benchmark"])
    ax.invert_yaxis()
    ax.set_xlim(0, 1.0)
    ax.set_xlabel("share of total sum of squares (Type II, main effects)")
    ax.set_title("Where score variance comes from (free-form slice)\n"
                 "rho = (template + decoding + shots SS) / model SS", fontsize=10)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=5, fontsize=8, frameon=False)
    fig.tight_layout()
    out = _save(fig, path, meta)
    plt.close(fig)
    return out


def shap_chart(shap_df: pd.DataFrame, meta: dict, path: Path) -> Path:
    """``shap_summary.png``: SHAP share per axis for the score regressor and each pair's sign
    classifier, per benchmark."""
    plt = _plt()
    d = shap_df.copy()
    d["row"] = d["benchmark"] + "  " + d["target"].str.replace("sign(", "flip ", regex=False).str.rstrip(")")
    skipped = d[d["status"] == "skipped"].groupby("row").size().index
    mat = d.pivot_table(index="row", columns="axis", values="share", aggfunc="first", dropna=False)
    order = d.drop_duplicates("row")["row"].tolist()
    mat = mat.reindex(index=order, columns=[a for a in SHAP_AXES if a in mat.columns])
    mat.index = [f"{r}  [never flips]" if r in set(skipped) else r for r in mat.index]
    fig, ax = plt.subplots(figsize=(8.5, 0.34 * len(mat) + 2.0))
    im = _annotated_heatmap(ax, mat, 0.0, 1.0, "magma_r")
    fig.colorbar(im, ax=ax, label="share of mean |SHAP| (per row)", shrink=0.6)
    ax.set_title("Which axis drives scores and flips (LightGBM surrogate, SHAP)\n"
                 "surrogate localises; not a causal estimate; n/a = axis constant or no classifier",
                 fontsize=10)
    ax.set_xlabel("axis")
    fig.tight_layout()
    out = _save(fig, path, meta)
    plt.close(fig)
    return out


def consistency_chart(rob: pd.DataFrame, reg: pd.DataFrame, meta: dict, path: Path) -> Path:
    """``consistency.png``: consistency vs mean score per (model, benchmark), with the OLS line
    and the random baseline p^m."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 5.2))
    benches = sorted(rob["benchmark"].unique())
    models = sorted(rob["model"].unique())
    cmap = __import__("matplotlib").colormaps["tab10"]
    markers = ["o", "s", "^", "D", "v", "P", "X", "*"]
    for bi, b in enumerate(benches):
        for mi, m in enumerate(models):
            r = rob[(rob["benchmark"] == b) & (rob["model"] == m)]
            if r.empty:
                continue
            ax.scatter(r["score_mean"], r["consistency"], color=cmap(bi), marker=markers[mi % len(markers)],
                       s=60, edgecolor="black", linewidth=0.5, zorder=3)
            ax.scatter(r["score_mean"], r["baseline"], color=cmap(bi), marker="x", s=25, alpha=0.7, zorder=2)
    r = reg.iloc[0]
    if np.isfinite(r["slope"]):
        xs = np.linspace(rob["score_mean"].min(), rob["score_mean"].max(), 50)
        ax.plot(xs, r["intercept"] + r["slope"] * xs, color="black", lw=1)
    from matplotlib.lines import Line2D  # deferred: matplotlib, loaded by _plt()

    handles = [Line2D([], [], color=cmap(i), marker="o", ls="", label=b) for i, b in enumerate(benches)]
    handles += [Line2D([], [], color="grey", marker=markers[i % len(markers)], ls="", label=m)
                for i, m in enumerate(models)]
    handles += [Line2D([], [], color="grey", marker="x", ls="", label="random baseline")]
    if np.isfinite(r["slope"]):
        handles.append(Line2D([], [], color="black", lw=1,
                              label=f"OLS slope {r['slope']:.2f}, R$^2$ {r['r2']:.2f}, n {int(r['n'])}"))
    ax.legend(handles=handles, fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    ax.set_xlabel("mean score over the envelope (free-form; CrowS-Pairs logprob)")
    ax.set_ylabel("consistency (correct in every config)")
    ax.set_title("Consistency vs performance per (model, benchmark)")
    ax.set_ylim(-0.03, 1.03)
    fig.tight_layout()
    out = _save(fig, path, meta)
    plt.close(fig)
    return out


def item_sd_chart(hist: pd.DataFrame, meta: dict, path: Path) -> Path:
    """``item_sd.png``: per benchmark, the distribution over items of each item's score SD across
    the configs, one step histogram per model."""
    plt = _plt()
    benches = sorted(hist["benchmark"].unique())
    models = sorted(hist["model"].unique())
    fig, axes = plt.subplots(1, max(len(benches), 1), figsize=(2.6 * max(len(benches), 1) + 1.5, 3.4),
                             sharey=True, squeeze=False)
    cmap = __import__("matplotlib").colormaps["tab10"]
    for ax, b in zip(axes[0], benches):
        for mi, m in enumerate(models):
            h = hist[(hist["benchmark"] == b) & (hist["model"] == m)].sort_values("bin_lo")
            if h.empty:
                continue
            edges = np.append(h["bin_lo"].to_numpy(dtype=float), h["bin_hi"].iloc[-1])
            ax.stairs(h["share"].to_numpy(dtype=float), edges, color=cmap(mi), lw=1.4, label=m)
        ax.set_title(b)
        ax.set_xlabel("item score SD across configs")
    axes[0][0].set_ylabel("share of items")
    if benches:
        axes[0][-1].legend(fontsize=8, loc="center left", bbox_to_anchor=(1.02, 0.5), frameon=False)
    fig.suptitle("Per-item score SD across the envelope's configs (0 = the same score everywhere)", fontsize=10)
    fig.tight_layout()
    out = _save(fig, path, meta)
    plt.close(fig)
    return out


def write_figures(tables_dir: str | Path, out_dir: str | Path, which=None) -> dict[str, Path]:
    """Draw the report figures from the tables in ``tables_dir`` into ``out_dir`` (PNG).

    ``which``: subset of :data:`FIGURES` names (default all); a missing source table is an
    error naming it."""
    tables_dir, out_dir = Path(tables_dir), Path(out_dir)
    names = list(which or FIGURES)
    unknown = [n for n in names if n not in FIGURES]
    if unknown:
        raise ValueError(f"unknown figure(s) {unknown}; known: {list(FIGURES)}")
    needed = sorted({t for n in names for t in FIGURES[n]})
    tables = {}
    for t in needed:
        p = tables_dir / f"{t}.parquet"
        if not p.exists():
            raise DataError(p, f"table needed for figure(s) {[n for n in names if t in FIGURES[n]]} not found")
        tables[t] = read_table(p)
    path = figure_outputs(out_dir)
    draw = {
        "rho_heatmap": lambda: rho_heatmap(tables["table2"][0], tables["table2"][1], path["rho_heatmap"]),
        "rho_significance": lambda: rho_significance_chart(tables["significance"][0], tables["bootstrap_items"][0],
                                                           tables["significance"][1], path["rho_significance"]),
        "orderings": lambda: orderings_chart(tables["table4"][0], tables["table4"][1], path["orderings"]),
        "anova_shares": lambda: anova_chart(tables["anova"][0], tables["anova"][1], path["anova_shares"]),
        "shap_summary": lambda: shap_chart(tables["shap"][0], tables["shap"][1], path["shap_summary"]),
        "consistency": lambda: consistency_chart(tables["robustness"][0], tables["robustness_regression"][0],
                                                 tables["robustness"][1], path["consistency"]),
        "item_sd": lambda: item_sd_chart(tables["robustness_item_sd_hist"][0], tables["robustness_item_sd_hist"][1],
                                         path["item_sd"]),
    }
    return {n: draw[n]() for n in names}
