"""Analyses and report: the paper's tables, variance attribution, robustness, subsample
and precision checks, the scale probe, GRID cards, figures and the Markdown report.

Each output has one ``write_*`` entry point in its submodule, which reads stamped Parquet
tables and writes stamped outputs atomically; :func:`safetyrepro.analysis.cli.register` adds
the ``analyze`` commands over them. Submodules are imported on use (pandas, statsmodels,
LightGBM, SHAP and matplotlib are heavy).
"""
