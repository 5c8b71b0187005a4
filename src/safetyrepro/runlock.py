"""One run at a time per results folder.

Snakemake's lock lives in the working directory, so two checkouts naming the same
``runtime.results_dir`` could write the same shards at once. A run therefore holds an
exclusive ``flock`` on ``<results_dir>/.safetyrepro.lock`` from ``onstart`` until its Snakemake
process exits (close-on-exec, so jobs and workers do not inherit it); a second run fails
before any job with :class:`ResultsInUse` naming the holder. flock works across NFS on Linux.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from pathlib import Path

from .errors import SafetyReproError, WriteError

LOCK_NAME = ".safetyrepro.lock"
_HELD: dict[str, int] = {}   # results folder -> descriptor held for this process's lifetime


class ResultsInUse(SafetyReproError):
    """Another live run holds the results folder's lock."""


def lock_path(results_dir: str | os.PathLike) -> Path:
    return Path(results_dir) / LOCK_NAME


def _holder(fd: int) -> dict:
    try:
        raw = os.pread(fd, 65536, 0)
        return json.loads(raw) if raw.strip() else {}
    except (OSError, ValueError):
        return {}


def hold_results_lock(results_dir: str | os.PathLike, run_id: str, config: str | os.PathLike) -> Path:
    """Take the results folder's lock for this process (idempotent), recording the holder in
    the lock file; ResultsInUse naming the holder if another process has it."""
    path = lock_path(results_dir)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if str(path.resolve()) in _HELD:
            return path
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            writable = True
        except PermissionError:            # a collaborator's lock file: flock needs only a read
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            writable = False
    except OSError as exc:
        raise WriteError(path, f"cannot create the results folder's run lock ({exc.strerror or exc})") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        h = _holder(fd)
        os.close(fd)
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise WriteError(path, f"cannot lock ({exc.strerror}); the results folder needs a filesystem "
                                   "with flock") from exc
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(h["since"])) if "since" in h else "?"
        raise ResultsInUse(
            f"{Path(results_dir)}: another run is using this results folder (pid {h.get('pid', '?')} on "
            f"{h.get('host', '?')}, run {h.get('run_id', '?')}, config {h.get('config', '?')}, since {since}; "
            f"lock {path}). Wait for it to finish or stop it; two runs would write the same files") from None
    if writable:
        info = {"pid": os.getpid(), "host": socket.gethostname(), "run_id": run_id, "config": str(config),
                "cwd": os.getcwd(), "since": time.time()}
        data = json.dumps(info, sort_keys=True).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
    _HELD[str(path.resolve())] = fd
    return path


def release_results_lock(results_dir: str | os.PathLike) -> None:
    """Give the lock back before the process ends (tests; a run keeps it to its end)."""
    fd = _HELD.pop(str(lock_path(results_dir).resolve()), None)
    if fd is not None:
        os.close(fd)
