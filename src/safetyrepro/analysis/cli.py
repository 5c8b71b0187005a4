"""``safetyrepro analyze ...``: thin commands over the analysis entry points.

Hook it into the main CLI with ``from .analysis.cli import register; register(app)``. Every
subcommand takes paths, writes its outputs atomically and prints the paths written; heavy
imports happen inside the commands."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def _echo_paths(paths: dict) -> None:
    for name, p in paths.items():
        typer.echo(f"{name}\t{p}")


def register(app: typer.Typer) -> None:
    analyze = typer.Typer(no_args_is_help=True, add_completion=False,
                          help="Analyses and report inputs from the cell-score and item-result tables.")
    app.add_typer(analyze, name="analyze")

    @analyze.command("tables")
    def tables(cell_scores: Path = typer.Argument(..., help="cell_scores.parquet"),
               out_dir: Path = typer.Option(..., "--out-dir"),
               threshold: float = typer.Option(0.95, "--threshold", help="parse-clean minimum parse rate"),
               bootstrap_samples: int = typer.Option(1000, "--bootstrap-samples"),
               bootstrap_seed: int = typer.Option(0, "--bootstrap-seed"),
               tol: float = typer.Option(0.0, "--tol", help="|score difference| <= tol is a tie"),
               rules: Optional[Path] = typer.Option(None, "--rules", help="envelope rules (default config/envelope.yaml)"),
               item_results: Optional[Path] = typer.Option(None, "--item-results",
                                                           help="item_results.parquet: noise columns in Tables 2 and 4"),
               noise_samples: Optional[int] = typer.Option(None, "--noise-samples",
                                                           help="draws of the noise references (default 2000)")):
        """Tables 2-4, parse-clean, tau_R with the total-order change rate and the bootstrap
        intervals over configurations; with --item-results the noise references beside rho_flip."""
        from .tables import write_paper_tables  # deferred: pandas; the CLI starts without it

        _echo_paths(write_paper_tables(cell_scores, out_dir, threshold=threshold,
                                       bootstrap_samples=bootstrap_samples, bootstrap_seed=bootstrap_seed, tol=tol,
                                       rules_path=rules, item_results_path=item_results,
                                       noise_samples=noise_samples))

    @analyze.command("significance")
    def significance(cell_scores: Path = typer.Argument(..., help="cell_scores.parquet"),
                     item_results: Path = typer.Argument(..., help="item_results.parquet"),
                     out_dir: Path = typer.Option(..., "--out-dir"),
                     alpha: float = typer.Option(0.05, "--alpha", help="family-wise level"),
                     samples: Optional[int] = typer.Option(None, "--samples", "--bootstrap-samples",
                                                           help="resampling draws (default: enough to reach alpha)"),
                     seed: int = typer.Option(0, "--seed", "--bootstrap-seed"),
                     family: str = typer.Option("pair", "--family", help="pair | benchmark | table"),
                     correction: str = typer.Option("maxt", "--correction", help="maxt | holm"),
                     tol: Optional[float] = typer.Option(None, "--tol", help="|score difference| <= tol is a tie")):
        """Item-level verdicts against noise: noise references, per-config tests, rho_flip_sig, crossover, power."""
        from .significance import write_significance  # deferred: pandas; the CLI starts without it

        _echo_paths(write_significance(cell_scores, item_results, out_dir, alpha=alpha, samples=samples, seed=seed,
                                       family=family, correction=correction, tol=tol))

    @analyze.command("nearest-reversal")
    def nearest_reversal(cell_scores: Path = typer.Argument(..., help="cell_scores.parquet"),
                         out_dir: Path = typer.Option(..., "--out-dir"),
                         nominal_config: str = typer.Option("T1-greedy-k0-freeform", "--nominal-config",
                                                            help="the config the distances start from"),
                         significance_configs: Optional[Path] = typer.Option(
                             None, "--significance-configs",
                             help="significance_configs.parquet: adds the nearest significant reversal"),
                         tol: Optional[float] = typer.Option(None, "--tol", help="|score difference| <= tol is a tie")):
        """Nearest reversing configuration per benchmark and pair: fewest axis changes from the
        nominal config to a strictly (and a significantly) reversed verdict."""
        from .tables import write_nearest_reversal  # deferred: pandas; the CLI starts without it

        _echo_paths(write_nearest_reversal(cell_scores, out_dir, nominal_config, significance_configs, tol))

    @analyze.command("variance")
    def variance(cell_scores: Path = typer.Argument(...), out_dir: Path = typer.Option(..., "--out-dir"),
                 seed: int = typer.Option(0, "--seed"), tol: float = typer.Option(0.0, "--tol")):
        """Four-way ANOVA shares and LightGBM/SHAP attribution."""
        from .variance import write_variance  # deferred: pandas; the CLI starts without it

        _echo_paths(write_variance(cell_scores, out_dir, tol=tol, seed=seed))

    @analyze.command("robustness")
    def robustness(cell_scores: Path = typer.Argument(...), item_results: Path = typer.Argument(...),
                   out_dir: Path = typer.Option(..., "--out-dir"),
                   nominal_config: str = typer.Option("T1-greedy-k0-freeform", "--nominal-config")):
        """Consistency vs random baseline, SDs (cells, items), drop rate, consistency-performance regression."""
        from .robustness import write_robustness  # deferred: pandas; the CLI starts without it

        _echo_paths(write_robustness(cell_scores, item_results, out_dir, nominal_config))

    @analyze.command("bbq-bias")
    def bbq_bias(cell_scores: Path = typer.Argument(...), item_results: Path = typer.Argument(...),
                 items_dir: Path = typer.Option(..., "--items-dir", help="folder holding bbq.parquet"),
                 out_dir: Path = typer.Option(..., "--out-dir")):
        """BBQ bias scores (ambiguous and disambiguated, Parrish et al. 2022) next to accuracy."""
        from .bbq_bias import write_bbq_bias  # deferred: pandas; the CLI starts without it

        _echo_paths(write_bbq_bias(cell_scores, item_results, items_dir, out_dir))

    @analyze.command("subsample")
    def subsample(item_results: Path = typer.Argument(...), items_dir: Path = typer.Option(..., "--items-dir"),
                  out_dir: Path = typer.Option(..., "--out-dir"), fraction: float = typer.Option(0.8, "--fraction"),
                  repeats: int = typer.Option(20, "--repeats"), seed: int = typer.Option(0, "--seed"),
                  rules: Optional[Path] = typer.Option(None, "--rules", help="envelope rules (default config/envelope.yaml)"),
                  noise_samples: Optional[int] = typer.Option(None, "--noise-samples",
                                                              help="draws of the noise reference (default 2000)")):
        """Cell-score ranges and core-ordering changes under stratified item subsamples, with the
        max rho_flip's noise reference on all items and on a subsample."""
        from .subsample import write_subsample_stability  # deferred: pandas; the CLI starts without it

        _echo_paths(write_subsample_stability(item_results, items_dir, out_dir, fraction, repeats, seed,
                                              rules_path=rules, noise_samples=noise_samples))

    @analyze.command("precision")
    def precision(main_scores: Path = typer.Argument(..., help="main (NF4) cell_scores.parquet"),
                  bf16_scores: Path = typer.Argument(..., help="BF16 rerun cell scores"),
                  out_dir: Path = typer.Option(..., "--out-dir"),
                  rules: Optional[Path] = typer.Option(None, "--rules"),
                  tol: float = typer.Option(0.0, "--tol")):
        """BF16 vs NF4 on the conservative_core cells."""
        from .precision import write_precision_check  # deferred: pandas; the CLI starts without it

        _echo_paths(write_precision_check(main_scores, bf16_scores, out_dir, rules_path=rules, tol=tol))

    @analyze.command("scale-probe")
    def scale_probe(cell_scores: Path = typer.Argument(..., help="cell_scores.parquet"),
                    out_dir: Path = typer.Option(..., "--out-dir"),
                    family: list[str] = typer.Option(..., "--family", help="small,large (model keys); repeatable"),
                    significance_configs: Optional[Path] = typer.Option(
                        None, "--significance-configs", help="significance_configs.parquet (significant reversals)"),
                    rules: Optional[Path] = typer.Option(None, "--rules", help="envelope rules (default config/envelope.yaml)"),
                    sub_envelope: str = typer.Option("conservative_core", "--sub-envelope"),
                    tol: Optional[float] = typer.Option(None, "--tol", help="|score difference| <= tol is a tie")):
        """Scale probe: does swapping a model for its larger sibling reverse a verdict within the
        sub-envelope (per benchmark, against each third model; and small vs large directly)."""
        from .scale_probe import write_scale_probe  # deferred: pandas; the CLI starts without it

        _echo_paths(write_scale_probe(cell_scores, out_dir, family, significance_configs_path=significance_configs,
                                      rules_path=rules, sub_envelope=sub_envelope, tol=tol))

    @analyze.command("cards")
    def cards(cell_scores: Path = typer.Argument(...),
              provenance: Path = typer.Option(..., "--provenance", help="JSON/YAML {model: {benchmark: record}}"),
              out_dir: Path = typer.Option(..., "--out-dir"),
              significance: Optional[Path] = typer.Option(None, "--significance",
                                                          help="significance.parquet (rho_flip_sig on the cards)"),
              nearest_reversal: Optional[Path] = typer.Option(None, "--nearest-reversal",
                                                              help="nearest_reversal.parquet (a line per pair)"),
              cross_package: Optional[Path] = typer.Option(None, "--cross-package",
                                                           help="cross_package.parquet (scores in other packages)"),
              precision: Optional[Path] = typer.Option(None, "--precision",
                                                       help="precision.parquet, precision_cells.parquet beside it"),
              scale_probe: Optional[Path] = typer.Option(None, "--scale-probe",
                                                         help="scale_probe.parquet (a line per family member)")):
        """GRID disclosure cards (JSON + Markdown) per (model, benchmark)."""
        from .cards import write_cards  # deferred: pandas; the CLI starts without it

        _echo_paths(write_cards(cell_scores, provenance, out_dir, significance, nearest_reversal, cross_package,
                                precision, scale_probe))

    @analyze.command("figures")
    def figures(tables_dir: Path = typer.Argument(...), out_dir: Path = typer.Option(..., "--out-dir")):
        """Report figures (PNG) from the analysis tables."""
        from .figures import write_figures  # deferred: pandas; the CLI starts without it

        _echo_paths(write_figures(tables_dir, out_dir))

    @analyze.command("report-md")
    def report_md(tables_dir: Path = typer.Argument(...), figures_dir: Path = typer.Option(..., "--figures-dir"),
                  out: Path = typer.Option(..., "--out")):
        """results/report.md: the report's tables in Markdown."""
        from .report_md import write_report_md  # deferred: pandas; the CLI starts without it

        typer.echo(str(write_report_md(tables_dir, figures_dir, out)))
