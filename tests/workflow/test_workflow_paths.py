"""Rule shell commands quote every interpolation: a real run whose project and results
folders hold a space and a "$(...)" runs its jobs and executes nothing from a path (issue 15)."""

from __future__ import annotations

import pytest

from workflow_support import make_project_copy, snakemake

pytestmark = pytest.mark.slow


def test_results_path_with_space_and_command_substitution(tmp_path):
    project, config = make_project_copy(tmp_path / "my project")
    import yaml

    cfg = yaml.safe_load(config.read_text())
    results = project / "results dir $(touch PWNED) `touch PWNED2`"
    cfg["runtime"]["results_dir"] = str(results)
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    shard = results / "shards" / "smol-fp32" / "xstest" / "T1-greedy-k0-logprob" / "s0.parquet"
    r = snakemake(project, config, str(shard.relative_to(project)))
    assert r.returncode == 0, r.stdout + r.stderr
    assert shard.is_file()
    assert (results / "items" / "xstest.parquet").is_file()
    assert (results / "logs" / "items" / "xstest.log").is_file()
    for where in (project, tmp_path, results, results.parent):
        assert not (where / "PWNED").exists() and not (where / "PWNED2").exists()
