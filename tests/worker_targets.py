"""Tiny real loader and call targets for tests/worker/test_worker.py (imported by worker processes,
which get this folder on PYTHONPATH)."""

from __future__ import annotations

import os
import time


def load(tag: str = "model", delay: float = 0.2, fail: bool = False) -> dict:
    """Stands in for model loading: takes ``delay`` seconds, returns a mutable state."""
    time.sleep(delay)
    if fail:
        raise RuntimeError(f"cannot load {tag}: weights missing")
    return {"tag": tag, "pid": os.getpid(), "calls": 0}


def echo(state: dict, value=None) -> dict:
    state["calls"] += 1
    return {"value": value, "tag": state["tag"], "pid": os.getpid(), "calls": state["calls"]}


def sleep(state: dict, seconds: float) -> int:
    time.sleep(seconds)
    state["calls"] += 1
    return os.getpid()


def fail(state: dict, message: str) -> None:
    raise ValueError(message)


def fail_fatal(state: dict) -> None:
    exc = RuntimeError("accelerator is in a bad state")
    exc.worker_fatal = True
    raise exc


def crash(state: dict) -> None:
    os._exit(1)


def stale(state: dict) -> None:
    """Answers like a cell whose planned fingerprint differs from what this worker loaded
    (cells.StaleWorkerError): the worker exits, the client may retry on a fresh one."""
    exc = RuntimeError(f"stale for this call (worker pid {os.getpid()})")
    exc.worker_fatal = True
    exc.worker_stale = True
    raise exc


def hold_gil(state: dict, seconds: float) -> None:
    """Blocks inside a C call that keeps the GIL (ctypes.PyDLL does not release it), as a
    stuck extension call may: no other thread of the worker runs, its watchdog included."""
    import ctypes

    ctypes.PyDLL(None).sleep(int(seconds))


def not_json(state: dict) -> object:
    return {"x": object()}


def write_table(state: dict, out: str, n: int = 1000, hang_before_rename: str | None = None) -> str:
    """Write a real shard-like Parquet file with safetyrepro.io.write_parquet. With
    ``hang_before_rename`` (a marker path) the data is written to the temp file, then the
    fsync touches the marker and blocks: the test kills the worker there."""
    import pyarrow as pa

    from safetyrepro import io

    if hang_before_rename:
        real_fsync = io.os.fsync

        def hang(fd):
            real_fsync(fd)
            open(hang_before_rename, "w").close()
            time.sleep(3600)

        io.os.fsync = hang
    table = pa.table({"item_id": [f"i{k}" for k in range(n)], "x": list(range(n))})
    io.write_parquet(table, out, {"kind": "test", "n": n})
    return out
