"""Items rebuilds never throw away finished results (issue 15): an items-code edit that
changes no item reruns the items job but no cell, and a failed items rebuild keeps the good
files. Real Snakemake runs on a copy of the project."""

from __future__ import annotations

import pytest

from workflow_support import cli, make_project_copy, planned, snakemake

from safetyrepro.io import read_metadata

pytestmark = pytest.mark.slow


def test_items_code_edits_rerun_no_cell_and_a_failed_rebuild_keeps_the_good_files(tmp_path):
    project, config = make_project_copy(tmp_path / "p")
    results = project / "results"
    shard = results / "shards" / "smol-fp32" / "xstest" / "T1-greedy-k0-logprob" / "s0.parquet"
    target = str(shard.relative_to(project))
    r = snakemake(project, config, target)
    assert r.returncode == 0, r.stdout + r.stderr
    items = results / "items" / "xstest.parquet"
    fewshot = results / "items" / "xstest.fewshot.parquet"
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in (items, fewshot, shard)}

    # an items-code edit that changes no item reruns nothing (the items rule's fingerprint
    # is the content the items code builds, not the code's bytes)
    code = project / "src" / "safetyrepro" / "items" / "build.py"
    code.write_text(code.read_text() + "\n# a comment: the items stay the same\n")
    counts, _ = planned(project, config, target)
    assert counts == {}
    # run anyway, the items job's command leaves files holding the same items untouched
    r = cli(project, "items", "--config", str(config), "--benchmark", "xstest",
            "--out-dir", str(results / "items"))
    assert r.returncode == 0 and "items unchanged" in r.stdout, r.stdout + r.stderr
    assert {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in before} == before

    # a failed rebuild (the items code now raises): the good files stay, and so does the shard
    code.write_text(code.read_text().replace(
        "    shash = subset_hash(", "    raise RuntimeError('injected items failure')\n    shash = subset_hash(", 1))
    r = snakemake(project, config, target)
    assert r.returncode != 0 and "injected items failure" in (results / "logs" / "items" / "xstest.log").read_text()
    # (Snakemake restores the update()-flagged files from its backup: same bytes, new mtime)
    assert {p: p.read_bytes() for p in before} == {p: b for p, (_, b) in before.items()}
    assert shard.stat().st_mtime_ns == before[shard][0]
    assert read_metadata(items)["kind"] == "items" and read_metadata(fewshot)["kind"] == "fewshot"

    # a settings change that changes the items reruns the benchmark's cells
    code.write_text(code.read_text().replace("    raise RuntimeError('injected items failure')\n", "", 1))
    import yaml

    cfg = yaml.safe_load(config.read_text())
    cfg["benchmarks"]["xstest"]["n_items"] = 2
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    counts, _ = planned(project, config, target)
    assert counts.get("items") == 1 and counts.get("cell") == 1
