"""Worker lifecycle seen from outside: which workers a state folder holds (status), stopping
them, the workers a cluster job owns, and the leases of runs that share workers. Standard
library only, like the client (the workflow's start and end hooks import it).
"""

from __future__ import annotations

import atexit
import os
import signal
import time
from pathlib import Path
from typing import Any

from ..procs import pid_alive
from .allocation import claim_allocation_owner
from .client import simple_request
from .errors import WorkerError
from .layout import WorkerPaths, device_locks, node_state_dir, private_dir, run_token
from .locks import FileLock, lock_is_held, read_holder
from .pidfiles import is_worker_process, list_pid_files, remove_if_owned


def _same_dir(holder: dict[str, Any], state_dir: str | os.PathLike) -> bool:
    return holder.get("state_dir") == str(Path(state_dir).absolute())


def worker_status(state_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """The workers registered in ``state_dir`` (pid files) with their live status, plus any
    other process holding a device lock."""
    out = []
    seen = set()
    for info in list_pid_files(state_dir):
        row = {k: info.get(k) for k in ("key", "pid", "host", "sock", "spec", "loader", "started")}
        row["alive"] = info["alive"]
        if info["alive"]:
            try:
                reply = simple_request(WorkerPaths(state_dir, info["key"]), {"op": "status"})
            except (WorkerError, ValueError):
                reply = None
            if reply and reply.get("ok") and reply["result"].get("pid") == info["pid"]:
                row.update(reply["result"])
            else:
                row["phase"] = "not answering (draining or starting)"
        out.append(row)
        seen.add(info["pid"])
    for lock in device_locks():
        holder = read_holder(lock)
        if holder and holder.get("pid") not in seen and _same_dir(holder, state_dir) \
                and lock_is_held(lock) \
                and is_worker_process(holder["pid"], holder.get("key")):
            out.append({"key": holder.get("key"), "pid": holder["pid"], "alive": True,
                        "phase": f"holding {lock.name} (draining)"})
    return out


def stop_workers(state_dir: str | os.PathLike, key: str | None = None, timeout: float = 60.0,
                 kill: bool = True) -> list[dict[str, Any]]:
    """Ask the workers in ``state_dir`` (only ``key``'s if given) to shut down, wait up to
    ``timeout`` s for them to exit (they finish their current call first), then SIGKILL the
    rest if ``kill``. Returns one {key, pid, outcome} per worker, outcome one of
    "stopped", "killed", "still running", "stale" (was already dead; files removed)."""
    targets: dict[int, dict[str, Any]] = {}
    for info in list_pid_files(state_dir):
        if key is not None and info.get("key") != key:
            continue
        if not info["alive"]:
            remove_if_owned(Path(info["path"]), info["pid"])
            targets[info["pid"]] = {"key": info.get("key"), "pid": info["pid"], "outcome": "stale"}
            continue
        targets[info["pid"]] = {"key": info.get("key"), "pid": info["pid"], "outcome": None}
        try:
            reply = simple_request(WorkerPaths(state_dir, info["key"]),
                                    {"op": "shutdown", "reason": "stop requested"})
        except (WorkerError, ValueError):
            reply = None
        if not (reply and reply.get("ok") and reply["result"].get("pid") == info["pid"]):
            try:
                os.kill(info["pid"], signal.SIGTERM)   # not answering: graceful via signal
            except ProcessLookupError:
                pass
    if key is None:               # also wait for draining workers still holding the device
        for lock in device_locks():
            holder = read_holder(lock)
            # a device holder of another run (another state folder) is not ours to stop
            if holder and holder.get("pid") not in targets and _same_dir(holder, state_dir) \
                    and lock_is_held(lock) \
                    and is_worker_process(holder["pid"], holder.get("key")):
                targets[holder["pid"]] = {"key": holder.get("key"), "pid": holder["pid"],
                                          "outcome": None}
    deadline = time.monotonic() + timeout
    pending = [t for t in targets.values() if t["outcome"] is None]
    while pending:
        for t in pending:
            if not is_worker_process(t["pid"], t["key"]):
                t["outcome"] = "stopped"
        pending = [t for t in pending if t["outcome"] is None]
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    for t in pending:
        if not kill:
            t["outcome"] = "still running"
            continue
        try:
            os.kill(t["pid"], signal.SIGKILL)
        except ProcessLookupError:
            pass
        end = time.monotonic() + 10.0
        while pid_alive(t["pid"]) and time.monotonic() < end:
            time.sleep(0.05)
        t["outcome"] = "killed"
        try:
            remove_if_owned(WorkerPaths(state_dir, t["key"]).pid, t["pid"])
        except (ValueError, TypeError):
            pass
    return list(targets.values())


def own_allocation_workers(state_root: str | os.PathLike) -> bool:
    """Inside a cluster job: if this process is the first of the job to ask (see
    :func:`state.claim_allocation_owner`), the workers that the job's cells start on this node
    belong to it: they exit when it is gone, and at its exit it stops them and waits for them
    (``<state_root>/<host>.<allocation>``), so no worker outlives the job. Called when the
    workflow is loaded in a cluster job. Returns whether this process became the owner."""
    if not claim_allocation_owner():
        return False
    # a worker still in a call gets 10 s to finish it, then SIGKILL (its shard is written
    # atomically; the cell reruns next time)
    atexit.register(stop_workers, node_state_dir(state_root), None, 10.0)
    return True


# ---- runs sharing workers -------------------------------------------------------------------
#
# A run (one Snakemake invocation) holds a lease, an flock on <state_dir>/runs/<run id>.lock,
# for as long as its main process lives; its jobs tell the worker their run id (RUN_ENV). At
# the end of a run, a worker that a run still holding its lease has called is left alone
# (it serves that run and exits after its idle timeout); the others are stopped.

def run_lease_path(state_dir: str | os.PathLike, run_id: str) -> Path:
    return Path(state_dir) / "runs" / f"{run_token(run_id)}.lock"


def hold_run_lease(state_dir: str | os.PathLike, run_id: str) -> FileLock:
    """Take this run's lease (keep the returned lock alive for the run's lifetime)."""
    private_dir(state_dir)
    private_dir(Path(state_dir) / "runs")
    lock = FileLock(run_lease_path(state_dir, run_id))
    lock.acquire()
    return lock


def stop_run_workers(state_dir: str | os.PathLike, run_id: str,
                     timeout: float = 60.0) -> list[dict[str, Any]]:
    """End of run ``run_id``: stop the workers of ``state_dir`` that no other live run has
    called; those are reported with outcome ``"kept for run <id>"``."""
    rows, to_stop = [], []
    for row in worker_status(state_dir):
        if not row.get("alive") or "runs" not in row:
            to_stop.append(row)
            continue
        others = [r for r in row["runs"] if r != run_token(run_id)
                  and lock_is_held(run_lease_path(state_dir, r))]
        if others:
            rows.append({"key": row.get("key"), "pid": row.get("pid"),
                         "outcome": f"kept for run {others[0]}"})
        else:
            to_stop.append(row)
    stopped_keys = {r.get("key") for r in to_stop if r.get("key")}
    for k in sorted(stopped_keys):
        rows += stop_workers(state_dir, key=k, timeout=timeout)
    return rows
