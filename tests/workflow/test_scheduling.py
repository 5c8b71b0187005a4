"""The local scheduler fix (safetyrepro.scheduling) on a real Snakemake run of a small
workflow: one scheduler pass per finished job, not a growing number of timer-driven passes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from safetyrepro.scheduling import MESSAGE

SNAKEFILE = '''
import os

N = int(os.environ["NJOBS"])

if os.environ.get("FIX") == "1":

    onstart:
        from safetyrepro.scheduling import drop_local_rate_limiter

        drop_local_rate_limiter(workflow)


rule all:
    input:
        expand("out/{i}.txt", i=range(N)),


rule one:
    output:
        "out/{i}.txt",
    shell:
        "sleep 0.2; touch {output}"
'''


def _passes(tmp: Path, fix: bool, n: int) -> tuple[int, str]:
    (tmp / "Snakefile").write_text(SNAKEFILE)
    env = {**os.environ, "NJOBS": str(n), "FIX": "1" if fix else "0"}
    r = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "1", "--verbose"], cwd=tmp,
                       env=env, capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert len(list((tmp / "out").glob("*.txt"))) == n
    return out.count("Resources before job selection"), out


@pytest.mark.slow
def test_local_run_schedules_once_per_finished_job(tmp_path):
    n = 30
    passes, out = _passes(tmp_path, True, n)
    assert MESSAGE in out
    assert passes <= n + 3  # one pass per finished job (+ the start and the final target)
    # without the fix Snakemake's rate-limiter timers add passes that multiply with the jobs
    plain = tmp_path / "plain"
    plain.mkdir()
    passes_plain, out_plain = _passes(plain, False, n)
    assert MESSAGE not in out_plain
    assert passes_plain > passes
