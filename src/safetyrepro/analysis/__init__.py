"""Analyses and report: the paper's tables, variance attribution, robustness metrics,
subsample and precision checks, GRID cards, figures and the Markdown report.

One entry point per output (each reads stamped Parquet tables and writes stamped outputs
atomically):

* :func:`safetyrepro.analysis.tables.write_paper_tables`
* :func:`safetyrepro.analysis.significance.write_significance`
* :func:`safetyrepro.analysis.tables.write_nearest_reversal`
* :func:`safetyrepro.analysis.variance.write_variance`
* :func:`safetyrepro.analysis.robustness.write_robustness`
* :func:`safetyrepro.analysis.subsample.write_subsample_stability`
* :func:`safetyrepro.analysis.bbq_bias.write_bbq_bias`
* :func:`safetyrepro.analysis.precision.write_precision_check`
* :func:`safetyrepro.analysis.scale_probe.write_scale_probe`
* :func:`safetyrepro.analysis.cards.write_cards`
* :func:`safetyrepro.analysis.figures.write_figures`
* :func:`safetyrepro.analysis.report_md.write_report_md`

CLI: :func:`safetyrepro.analysis.cli.register` adds the ``analyze`` command group.
Submodules are imported on use (pandas, statsmodels, LightGBM, SHAP and matplotlib are heavy).
"""
