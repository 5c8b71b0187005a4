"""One run per results folder (safetyrepro.runlock): a second run on a results folder that a
live run holds, even from another checkout (Snakemake's own lock is per working directory),
fails before any job naming the holder; a dry run plans regardless; the lock dies with its
holder."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import pytest

from safetyrepro.runlock import LOCK_NAME, ResultsInUse, hold_results_lock, release_results_lock
from workflow_support import make_project_copy, snakemake

HOLD = ("import sys, time; from safetyrepro.runlock import hold_results_lock; "
        "hold_results_lock(sys.argv[1], 'run-holder', '/elsewhere/config.yaml'); print('held', flush=True); "
        "time.sleep(600)")


def _holder(results):
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(results)], stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert p.stdout.readline().strip() == "held"
    return p


def test_a_second_holder_is_refused_naming_the_first(tmp_path):
    results = tmp_path / "results"
    p = _holder(results)
    try:
        with pytest.raises(ResultsInUse) as err:
            hold_results_lock(results, "run-me", "c.yaml")
        msg = str(err.value)
        assert f"pid {p.pid} on {socket.gethostname()}" in msg and "run run-holder" in msg
        assert "config /elsewhere/config.yaml" in msg and str(results / LOCK_NAME) in msg
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    # the lock died with its holder
    hold_results_lock(results, "run-me", "c.yaml")
    hold_results_lock(results, "run-me", "c.yaml")       # again in the same process: already held
    release_results_lock(results)


@pytest.mark.slow
def test_a_second_snakemake_run_on_a_held_results_folder_exits_2(tmp_path):
    project, config = make_project_copy(tmp_path / "p")
    results = project / "results"
    p = _holder(results)
    try:
        dry = snakemake(project, config, "-n")
        assert dry.returncode == 0, dry.stdout + dry.stderr
        r = snakemake(project, config)
        out = r.stdout + r.stderr
        assert r.returncode == 2, out
        assert "another run is using this results folder" in out and f"pid {p.pid}" in out
        # no job ran: nothing but the lock and the plan's item-content cache (written by planning)
        assert {x.name for x in results.iterdir()} <= {LOCK_NAME, "items"}
        assert not list(results.rglob("*.parquet")) and not (results / "logs").exists()
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
