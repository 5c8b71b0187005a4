"""A dry run of the scale-probe test config (embedded models standing in for the families) plans
the scale_probe job with its declared inputs, outputs and families, and the report reads its
tables; a config without `analysis.scale_probe` plans no such job (test_workflow_lint's
all-steps test covers the default config)."""
import re
import subprocess
import sys
from pathlib import Path

import yaml

from config_support import config_copy
from safetyrepro.analysis import outputs

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _dry_run(tmp_path, edit=None):
    cfg = config_copy(ROOT / "tests/configs/scale_probe_tiny.yaml")
    cfg["runtime"]["results_dir"] = str(tmp_path / "results")
    cfg["envelope"]["rules"] = str(ROOT / "tests/configs/envelope_tiny.yaml")
    if edit:
        edit(cfg)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    r = subprocess.run([str(BIN / "snakemake"), "-n", "-p", "--cores", "1", "--resources", "gpu=1",
                        "--directory", str(ROOT), "--configfile", str(path)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    jobs = {}
    for m in re.finditer(r"^rule ([\w.-]+):\n((?:    .*\n)+)Shell command: (.*)\n", r.stdout + r.stderr, flags=re.M):
        fields = dict(line.strip().split(": ", 1) for line in m.group(2).splitlines() if ": " in line)
        jobs[m.group(1)] = (fields, m.group(3))
    return jobs, tmp_path / "results" / "tables"


def test_scale_probe_rule_planned_with_its_inputs(tmp_path):
    jobs, tables = _dry_run(tmp_path)
    fields, shell = jobs["scale_probe"]
    assert fields["input"].split(", ") == [str(tables / "cell_scores.parquet"),
                                           str(tables / "significance_configs.parquet")]
    assert set(fields["output"].split(", ")) == {str(p) for p in outputs.table_outputs("scale-probe", tables).values()}
    assert "-m safetyrepro analyze scale-probe " in shell and "--family smollm2-135m,qwen2.5-0.5b" in shell
    assert "--rules " in shell and "envelope_tiny.yaml" in shell
    # the report reads the probe's tables
    report_inputs = jobs["report_md"][0]["input"].split(", ")
    assert str(tables / "scale_probe.parquet") in report_inputs and str(tables / "scale_probe_pairs.parquet") in report_inputs
    # and the cards, a line per family member
    assert str(tables / "scale_probe.parquet") in jobs["cards"][0]["input"].split(", ")
    assert f"--scale-probe {tables / 'scale_probe.parquet'}" in jobs["cards"][1]


def test_no_scale_probe_job_without_the_key(tmp_path):
    jobs, tables = _dry_run(tmp_path, lambda cfg: cfg["analysis"].pop("scale_probe"))
    assert "scale_probe" not in jobs and "significance" in jobs
    assert str(tables / "scale_probe.parquet") not in jobs["report_md"][0]["input"]
    assert "--scale-probe" not in jobs["cards"][1] and str(tables / "scale_probe.parquet") not in jobs["cards"][0]["input"]


def test_bad_family_stops_the_workflow_naming_the_field(tmp_path):
    import pytest

    with pytest.raises(AssertionError, match=r"analysis.scale_probe.families.0"):
        _dry_run(tmp_path, lambda cfg: cfg["analysis"].update(scale_probe={"families": [["smollm2-135m", "nope"]]}))
