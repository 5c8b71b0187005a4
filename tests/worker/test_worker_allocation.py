"""A worker inside a cluster allocation: its state folder carries the Slurm job id, its socket
does not depend on $TMPDIR, and it ends with the process that owns the job's workers (real
worker processes with the tiny loader of tests/worker_targets.py; Slurm is simulated by
SLURM_JOB_ID, the real cluster runs are in test_slurm.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from safetyrepro.worker import stop_workers
from safetyrepro.worker.errors import WorkerError
from safetyrepro.worker.events import read_events
from safetyrepro.sysutil import hostname
import safetyrepro.worker.allocation as allocation
import safetyrepro.worker.layout as layout
from safetyrepro.worker.allocation import OWNER_ENV, allocation_owner
from safetyrepro.worker.layout import WorkerPaths, node_state_dir
from safetyrepro.worker.pidfiles import is_worker_process, read_pid_file

ROOT = Path(__file__).resolve().parents[2]
PYTHONPATH = os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")])


def test_state_dir_is_per_allocation(monkeypatch, tmp_path):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert node_state_dir(tmp_path) == tmp_path / hostname()
    monkeypatch.setenv("SLURM_JOB_ID", "4711")
    assert node_state_dir(tmp_path) == tmp_path / f"{hostname()}.slurm4711"
    assert node_state_dir(tmp_path, host="n7") == tmp_path / "n7.slurm4711"


def test_device_lock_names_the_nodes_gpu_not_the_renumbered_one(monkeypatch):
    # a cluster with device cgroups shows every job its GPU as CUDA_VISIBLE_DEVICES=0; two jobs
    # on GPUs 2 and 3 of one node must not share a device lock
    for var in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(var, raising=False)
    assert layout.device_id() == "0"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-1a2b/3")
    assert layout.device_id() == "GPU-1a2b_3"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setenv("SLURM_JOB_GPUS", "2,5")
    first = layout.device_id()
    monkeypatch.setenv("SLURM_JOB_GPUS", "3")
    assert (first, layout.device_id()) == ("2", "3")
    monkeypatch.setenv("SLURM_STEP_GPUS", "5")  # a step's own GPU wins over the job's
    assert layout.device_id() == "5"


def test_long_socket_path_does_not_depend_on_tmpdir(monkeypatch, tmp_path):
    deep = tmp_path / ("x" * 60) / "results" / ".workers" / "node.slurm123456"
    monkeypatch.setenv("TMPDIR", str(tmp_path / "job1"))
    first = WorkerPaths(deep, "smol-nf4.nf4.93b3b645beb4").sock
    monkeypatch.setenv("TMPDIR", str(tmp_path / "job2"))
    second = WorkerPaths(deep, "smol-nf4.nf4.93b3b645beb4").sock
    assert first == second
    assert first.parent == Path(f"/tmp/safetyrepro-{os.getuid()}")
    assert len(os.fsencode(str(first))) <= layout.MAX_SOCKET_PATH


@pytest.mark.parametrize("kind", ["symlink", "open_mode"])
def test_foreign_or_open_socket_dir_is_refused(monkeypatch, tmp_path, kind):
    monkeypatch.setattr(layout, "SHORT_SOCKET_PARENT", str(tmp_path))
    d = tmp_path / f"safetyrepro-{os.getuid()}"
    if kind == "symlink":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        d.symlink_to(tmp_path / "elsewhere")
    else:
        d.mkdir()
        d.chmod(0o755)
    with pytest.raises(WorkerError, match=f"{d} .*refusing") as err:
        layout.short_socket_dir()
    assert ("is a symbolic link" if kind == "symlink" else "has mode 755") in str(err.value)


OWNER_SCRIPT = """
import os, sys, threading, time
os.environ["SLURM_JOB_ID"] = "424242"
from safetyrepro.worker.allocation import claim_allocation_owner
assert claim_allocation_owner()
from safetyrepro.worker import run_in_worker
state_dir, target, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
def go():
    run_in_worker(state_dir, "m1", "worker_targets:load", {"tag": "m1", "delay": 0.1},
                  "worker_targets:" + target, {"seconds": seconds} if target == "sleep" else {},
                  env=dict(os.environ), idle_timeout=120)
t = threading.Thread(target=go, daemon=True)
t.start()
t.join(timeout=float(sys.argv[4]))
print("owner exits", flush=True)
os._exit(0)   # no atexit stop: the worker must notice on its own
"""


def _run_owner(tmp_path, target, seconds, live_s):
    sd = tmp_path / "w"
    # worker_targets' loader and calls are allowed only where the test says so (issue 15)
    env = dict(os.environ, PYTHONPATH=PYTHONPATH, SAFETYREPRO_WORKER_TEST_TARGETS="worker_targets")
    env.pop("SLURM_JOB_ID", None)
    env.pop(OWNER_ENV, None)
    proc = subprocess.run([sys.executable, "-c", OWNER_SCRIPT, str(sd), target, str(seconds),
                           str(live_s)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "owner exits" in proc.stdout, proc.stderr
    return sd


def _worker_exit(sd, timeout=15.0):
    evs = read_events(sd / "events.jsonl")[0]
    [start] = [e for e in evs if e["event"] == "start"]
    end = time.monotonic() + timeout
    while is_worker_process(start["pid"]) and time.monotonic() < end:
        time.sleep(0.1)
    alive = is_worker_process(start["pid"])
    exits = [e for e in read_events(sd / "events.jsonl")[0] if e["event"] == "exit"]
    return start, alive, exits


def test_idle_worker_exits_when_its_owner_is_gone(tmp_path):
    sd = _run_owner(tmp_path, "echo", 0, 60)
    try:
        start, alive, exits = _worker_exit(sd)
        assert start["allocation"] == "slurm424242"
        assert not alive, "the worker outlived its owner"
        assert len(exits) == 1 and exits[0]["reason"].startswith("owner process"), exits
        assert read_pid_file(WorkerPaths(sd, "m1").pid) is None
    finally:
        stop_workers(sd, timeout=5)


def test_busy_worker_exits_soon_after_its_owner_is_gone(tmp_path):
    # the owner dies 3 s into a 60 s call: the worker gives up the call after the grace time
    sd = _run_owner(tmp_path, "sleep", 60, 3)
    try:
        t_gone = time.time()
        start, alive, exits = _worker_exit(sd)
        assert not alive, "the busy worker outlived its owner"
        assert len(exits) == 1 and exits[0]["abandoned"] == "worker_targets:sleep", exits
        assert exits[0]["t"] - t_gone < 10
    finally:
        stop_workers(sd, timeout=5)


def test_owner_claim_is_inherited_not_taken_over(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.delenv(OWNER_ENV, raising=False)
    assert allocation.claim_allocation_owner()
    assert allocation_owner() == os.environ[OWNER_ENV].split(":", 2)[2]
    assert not allocation.claim_allocation_owner()          # already owned by a live process
    monkeypatch.setenv("SLURM_JOB_ID", "78")           # another job: the claim is not its
    assert allocation_owner() is None
    monkeypatch.delenv("SLURM_JOB_ID")
    assert allocation_owner() is None and not allocation.claim_allocation_owner()
