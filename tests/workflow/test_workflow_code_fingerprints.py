"""Editing the code that computes a table reruns that table, and only the tables computed
with it (a real Snakemake run on a copy of the project, over synthetic cell scores: no model
runs); a table left from older code is marked STALE in the report."""

from __future__ import annotations

import json

import pytest

from analysis_synth import make_dataset, provenance_for
from workflow_support import cli, make_project_copy, planned, snakemake

pytestmark = pytest.mark.slow

TARGETS = ("results/tables/table2.parquet", "results/tables/anova.parquet",
           "results/tables/rho_flip.parquet", "results/cards/index.json")
# only the table rules run; the synthetic cell_scores.parquet (and item_results.parquet, which
# the cards' significance and nearest-reversal inputs read) stand in for aggregation
RULES = ("--allowed-rules", "paper_tables", "variance", "rho_flip", "significance", "nearest_reversal", "cards")


def _append(path, line="\n# an edit\n"):
    original = path.read_text()
    path.write_text(original + line)
    return original


def test_editing_a_metric_reruns_the_tables_computed_with_it(tmp_path):
    # no precision check: its tables need bf16 cells, which this run of the table rules has not got
    project, config = make_project_copy(tmp_path / "proj", {"analysis": {"bootstrap_samples": 50,
                                                                         "precision_check": False}})
    tables = project / "results" / "tables"
    # the run's models: the cards rule declares one card per configured model and benchmark
    data = make_dataset(tmp_path / "synth", n_items=8, models=["smol-fp32", "smol-nf4"],
                        benchmarks=["truthfulqa", "xstest"],
                        rules_path=project / "tests" / "configs" / "envelope_tiny.yaml")
    tables.mkdir(parents=True)
    (tables / "cell_scores.parquet").write_bytes(data["cell_scores"].read_bytes())
    (tables / "item_results.parquet").write_bytes(data["item_results"].read_bytes())
    (tables / "provenance.json").write_text(json.dumps(provenance_for(data["cells"])))

    r = snakemake(project, config, *TARGETS, *RULES, timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert planned(project, config, *TARGETS, *RULES)[0] == {}  # up to date

    src = project / "src" / "safetyrepro"
    # a metric: every rule whose code imports metrics/ reruns
    flips = src / "metrics" / "flips.py"
    _append(flips)  # kept: the tables below are rebuilt with this code
    assert set(planned(project, config, *TARGETS, *RULES)[0]) == {"paper_tables", "variance", "rho_flip",
                                                                  "significance", "nearest_reversal", "cards"}

    # until they rerun, the report marks the tables the old code wrote
    report = project / "results" / "report.md"
    r = cli(project, "analyze", "report-md", str(tables), "--figures-dir", str(project / "results" / "figures"),
            "--out", str(report))
    assert r.returncode == 0, r.stdout + r.stderr
    text = report.read_text()
    assert "STALE tables" in text and "**STALE: `table2`" in text and "**STALE: `anova`" in text
    assert "every table was computed by the current code" not in text

    r = snakemake(project, config, *TARGETS, *RULES, timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert planned(project, config, *TARGETS, *RULES)[0] == {}
    r = cli(project, "analyze", "report-md", str(tables), "--figures-dir", str(project / "results" / "figures"),
            "--out", str(report))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "STALE" not in report.read_text()
    assert "every table was computed by the current code" in report.read_text()

    # one analysis's own module: that rule only
    original = _append(src / "analysis" / "variance.py")
    assert set(planned(project, config, *TARGETS, *RULES)[0]) == {"variance"}
    (src / "analysis" / "variance.py").write_text(original)

    # code none of these tables is computed with (the robustness analysis): nothing reruns
    original = _append(src / "analysis" / "robustness.py")
    assert planned(project, config, *TARGETS, *RULES)[0] == {}
    (src / "analysis" / "robustness.py").write_text(original)
