"""Both execution profiles load in Snakemake and apply their resources (dry runs, no cluster).

The real Slurm run is in test_slurm.py (separate CI step).
"""

import re
import subprocess
import sys

import pytest

from slurm_helpers import PROFILES, profile_settings, write_smoke_workflow


def _dry_run(workdir, profile):
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "--profile", str(PROFILES / profile),
         "--directory", str(workdir)],
        capture_output=True, text=True, timeout=120, cwd=workdir,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


def _job_resources(output: str, rule: str) -> dict[str, str]:
    """The 'resources:' line of a rule's job block in a dry run, as a dict."""
    block = re.search(rf"rule {rule}:\n(?:    .*\n)*?    resources: (.*)\n", output)
    assert block, f"no job block for rule {rule} in:\n{output}"
    return dict(item.split("=", 1) for item in block.group(1).split(", "))


@pytest.mark.parametrize("profile", ["default", "slurm", "paper"])
def test_profile_is_valid_yaml_with_documented_keys(profile):
    settings = profile_settings(PROFILES / profile)
    assert settings["rerun-incomplete"] is True
    # the paper's multi-hour run keeps going past a failed cell; the others fail fast
    assert settings["keep-going"] is (profile == "paper")
    assert settings["rerun-triggers"] == ["mtime", "params", "input", "software-env", "code"]


def test_default_profile_runs_gpu_jobs_one_at_a_time(tmp_path):
    settings = profile_settings(PROFILES / "default")
    assert settings["executor"] == "local"
    assert settings["resources"] == {"gpu": 1}
    # Three gpu=1 jobs with three cores free: the profile's gpu limit must serialise them.
    (tmp_path / "Snakefile").write_text(
        'rule all:\n'
        '    input: expand("o/{i}.txt", i=range(3))\n'
        'rule g:\n'
        '    output: "o/{i}.txt"\n'
        '    resources: gpu=1\n'
        '    shell: "date +%s.%N > {output}; sleep 0.5; date +%s.%N >> {output}"\n'
    )
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "--profile", str(PROFILES / "default"),
         "--cores", "3", "--directory", str(tmp_path)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    spans = sorted(
        tuple(float(t) for t in (tmp_path / "o" / f"{i}.txt").read_text().split())
        for i in range(3)
    )
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert start >= end, spans


def test_slurm_profile_applies_default_resources(tmp_path):
    settings = profile_settings(PROFILES / "slurm")
    assert settings["executor"] == "slurm"
    assert settings["slurm-status-command"] == "squeue"
    defaults = settings["default-resources"]
    write_smoke_workflow(tmp_path)
    out = _dry_run(tmp_path, "slurm")
    cpu = _job_resources(out, "cpu")
    assert cpu["mem_mb"] == str(defaults["mem_mb"])
    assert cpu["runtime"] == str(defaults["runtime"])
    gpu = _job_resources(out, "gpu")
    assert (gpu["gpu"], gpu["mem_mb"], gpu["runtime"]) == ("1", "300", "5")


def test_paper_profile_keeps_going_and_lists_failed_jobs_with_errors(tmp_path):
    """A real run through profiles/paper: two jobs fail first (higher priority), the third
    still runs, and the onerror hook (the workflow's: safetyrepro.run_summary.finish_run with
    Snakemake's log) lists both failures with the error line of each job's log."""
    import json

    (tmp_path / "Snakefile").write_text(
        'from safetyrepro.run_summary import finish_run\n'
        'rule all:\n'
        '    input: expand("o/{i}.txt", i=range(3))\n'
        'rule bad:\n'
        '    output: "o/{i}.txt"\n'
        '    wildcard_constraints: i="[01]"\n'
        '    log: "logs/{i}.log"\n'
        '    priority: 10\n'
        '    shell: "(echo loading; echo \'error: cell m/b/c/s{wildcards.i}: boom {wildcards.i}\' >&2; exit 1) 2> {log}"\n'
        'rule good:\n'
        '    output: "o/{i}.txt"\n'
        '    wildcard_constraints: i="2"\n'
        '    shell: "echo ok > {output}"\n'
        'onerror:\n'
        '    finish_run("res", 0.0, ok=False, snakemake_log=log)\n'
    )
    import os

    src = str(PROFILES.parent / "src")  # this checkout's package, whatever the cwd
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (src, os.environ.get("PYTHONPATH", "")) if p)}
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "--profile", str(PROFILES / "paper"),
         "--cores", "1", "--directory", str(tmp_path)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert (tmp_path / "o" / "2.txt").read_text() == "ok\n", out  # kept going
    assert "failed jobs (2):" in out, out
    for i in (0, 1):
        assert f"error: cell m/b/c/s{i}: boom {i}" in out, out
    summary = json.loads((tmp_path / "res" / "logs" / "run_summary.json").read_text())
    assert summary["run_ok"] is False
    failed = sorted(summary["failed_jobs"], key=lambda r: r["output"])
    assert [f["rule"] for f in failed] == ["bad", "bad"]
    assert [f["output"] for f in failed] == [["o/0.txt"], ["o/1.txt"]]
    assert [f["error"] for f in failed] == [f"error: cell m/b/c/s{i}: boom {i}" for i in (0, 1)]
