"""What each analysis step writes, by name: the one list that a step's code writes and its
workflow rule declares (``workflow/rules/analysis.smk`` and ``report.smk`` import it).

A step is a ``safetyrepro analyze`` command: table steps write ``<name>.parquet`` (stamped)
and ``<name>.csv``, the figures step ``<name>.png``, the cards step a JSON and a Markdown card
per (model, benchmark) and an index. Nothing heavy is imported, so the Snakefile reads it
at no cost."""

from __future__ import annotations

import re
from pathlib import Path

# table step (the `analyze` command) -> the tables it writes, in writing order
TABLE_STEPS: dict[str, tuple[str, ...]] = {
    "tables": ("table2", "table3", "table4", "parse_clean", "tau_r", "bootstrap"),
    "significance": ("significance", "significance_configs", "significance_benchmarks", "bootstrap_items"),
    "nearest-reversal": ("nearest_reversal",),
    "variance": ("anova", "shap"),
    "robustness": ("robustness", "robustness_item_sd", "robustness_item_sd_hist", "robustness_regression"),
    "subsample": ("subsample_stability", "subsample_cells", "subsample_rho_flip"),
    "bbq-bias": ("bbq_bias", "bbq_bias_summary"),
    "precision": ("precision", "precision_cells"),
    "scale-probe": ("scale_probe", "scale_probe_pairs"),
}

# figure -> the tables it is drawn from (the figures step reads exactly these)
FIGURES: dict[str, tuple[str, ...]] = {
    "rho_heatmap": ("table2",),
    "rho_significance": ("significance", "bootstrap_items"),
    "orderings": ("table4",),
    "anova_shares": ("anova",),
    "shap_summary": ("shap",),
    "consistency": ("robustness", "robustness_regression"),
    "item_sd": ("robustness_item_sd_hist",),
}

# the tables report.md shows (those a run did not produce are named as missing there)
REPORT_TABLES: tuple[str, ...] = (
    "significance_benchmarks", "table2", "significance", "bootstrap_items", "table3", "table4", "parse_clean", "tau_r", "bootstrap",
    "nearest_reversal", "subsample_stability", "subsample_rho_flip", "precision", "anova", "shap",
    "robustness", "robustness_item_sd", "robustness_regression", "bbq_bias_summary", "cross_package",
    "scale_probe", "scale_probe_pairs")

CARDS_INDEX = "index.json"


def step_tables(step: str) -> tuple[str, ...]:
    """The tables of table step ``step``; KeyError naming the known steps otherwise."""
    try:
        return TABLE_STEPS[step]
    except KeyError:
        raise KeyError(f"no analysis table step {step!r}; known: {sorted(TABLE_STEPS)}") from None


def table_outputs(step: str, out_dir: str | Path) -> dict[str, Path]:
    """``{name: <out_dir>/<name>.parquet, name_csv: <out_dir>/<name>.csv}`` for every table of
    ``step``: the files the step writes (:func:`.common.write_tables` returns the same dict)."""
    out_dir = Path(out_dir)
    paths: dict[str, Path] = {}
    for name in step_tables(step):
        paths[name] = out_dir / f"{name}.parquet"
        paths[f"{name}_csv"] = out_dir / f"{name}.csv"
    return paths


def rho_flip_outputs(out_dir: str | Path) -> dict[str, Path]:
    """What ``safetyrepro rho-flip CELL_SCORES --out <out_dir>/rho_flip.parquet`` writes: the
    pairs table (stamped Parquet) and its CSV (:func:`safetyrepro.metrics.tables.write_pairwise_table`
    names its files with :func:`rho_flip_files`; the ``rho_flip`` rule declares the same)."""
    return rho_flip_files(Path(out_dir) / "rho_flip.parquet")


def rho_flip_files(out: str | Path) -> dict[str, Path]:
    """The files the rho-flip command writes for its ``--out`` table: it and its CSV."""
    return _with_csv(Path(out), "pairs")


def cross_package_outputs(out_dir: str | Path, figures_dir: str | Path) -> dict[str, Path]:
    """What the ``cross-package`` command writes, given its ``--out`` table in ``out_dir`` and
    its ``--figure`` in ``figures_dir``: the table, its CSV, the per-item table and the figure
    (:func:`cross_package_files` names the files from ``--out``; the rule declares the same)."""
    return cross_package_files(Path(out_dir) / "cross_package.parquet") | \
        {"figure": Path(figures_dir) / "cross_package.png"}


def cross_package_files(out: str | Path) -> dict[str, Path]:
    """The files the cross-package stage writes next to its ``--out`` table."""
    out = Path(out)
    return _with_csv(out, "table") | {"per_item": out.with_name(out.stem + "_items.parquet")}


def _with_csv(parquet: Path, key: str) -> dict[str, Path]:
    return {key: parquet, "csv": parquet.with_suffix(".csv")}


def figure_outputs(out_dir: str | Path) -> dict[str, Path]:
    """``{figure: <out_dir>/<figure>.png}`` of every figure the figures step draws."""
    return {name: Path(out_dir) / f"{name}.png" for name in FIGURES}


def figure_sources() -> tuple[str, ...]:
    """The tables the figures step reads, each once, in figure order."""
    return tuple(dict.fromkeys(t for sources in FIGURES.values() for t in sources))


def card_stem(model: str, benchmark: str) -> str:
    """The file stem of the (model, benchmark) card: ``<model>__<benchmark>`` with anything
    but letters, digits, ``.``, ``_`` and ``-`` replaced by ``_``."""
    def slug(s: str) -> str:
        return re.sub(r"[^A-Za-z0-9_.-]+", "_", str(s))
    return f"{slug(model)}__{slug(benchmark)}"


def card_outputs(out_dir: str | Path, pairs) -> dict[str, Path]:
    """The cards step's files for the (model, benchmark) ``pairs`` (a run's models x
    benchmarks): ``index`` and, per card, ``<stem>.json`` and ``<stem>.md``."""
    out_dir = Path(out_dir)
    paths: dict[str, Path] = {}
    for model, benchmark in pairs:
        stem = card_stem(model, benchmark)
        paths[f"{stem}.json"] = out_dir / f"{stem}.json"
        paths[f"{stem}.md"] = out_dir / f"{stem}.md"
    paths["index"] = out_dir / CARDS_INDEX
    return paths
