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


def test_jobs_side_by_side_count_once_in_the_busy_time(tmp_path):
    """With --cores 2 two 2-second jobs run side by side: their durations sum to about 4 s,
    but a job was running for only about 2 s (Snakemake's log has one-second stamps)."""
    pr = benchmark_script("profile_run")
    (tmp_path / "Snakefile").write_text(
        'rule all:\n'
        '    input: "o/a", "o/b"\n'
        'rule slow:\n'
        '    output: "o/{x}"\n'
        '    shell: "sleep 2; touch {output}"\n')
    r = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "2", "--directory", str(tmp_path)],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    (log,) = (tmp_path / ".snakemake" / "log").glob("*.snakemake.log")
    parsed = pr.parse_log(log)
    assert parsed["per_stage"]["slow"][0] == 2
    assert parsed["per_stage"]["slow"][1] >= 3.5
    assert 1.5 <= parsed["busy"] <= 3.5, parsed
    assert 1.5 <= parsed["stage_span"]["slow"] <= 3.5, parsed
    assert pr.busy_seconds([(0, 2), (1, 3), (5, 6)]) == 4
