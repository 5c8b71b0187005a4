"""benchmarks/profile_run.py on real Snakemake logs: it profiles the newest log of a run that
executed jobs, passing over the newer logs of a dry run, and says which log to pass when no
log recorded a finished job."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from workflow_support import benchmark_script


def _snakemake(workdir, *args):
    r = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "1", "--directory", str(workdir),
                        *args], capture_output=True, text=True, timeout=120, cwd=workdir)
    assert r.returncode == 0, r.stdout + r.stderr


def test_newest_log_that_ran_jobs_is_picked(tmp_path):
    pr = benchmark_script("profile_run")
    (tmp_path / "Snakefile").write_text(
        'rule all:\n'
        '    input: "results/shards_bf16/m/b/c/s0.parquet", "results/shards/m/b/c/s0.parquet"\n'
        'rule cell:\n'
        '    output: "results/{root}/m/b/c/s0.parquet"\n'
        '    shell: "touch {output}"\n')
    logs = lambda: set((tmp_path / ".snakemake" / "log").glob("*.snakemake.log"))  # noqa: E731
    _snakemake(tmp_path)
    (ran,) = logs()
    time.sleep(1.1)
    _snakemake(tmp_path, "--report", "report.html")   # a newer log that executed no job
    others = logs() - {ran}
    assert others and all(p.stat().st_mtime > ran.stat().st_mtime for p in others)
    log, parsed = pr.pick_log(sorted(logs()))
    assert log == ran
    assert parsed["per_stage"]["cell"][0] == 1 and parsed["per_stage"]["cell_bf16"][0] == 1
    assert parsed["per_stage"]["all"][0] == 1 and parsed["n_jobs"] == 3
    with pytest.raises(SystemExit, match=f"none of the {len(others)} Snakemake log.*pass the log"):
        pr.pick_log(sorted(others))
