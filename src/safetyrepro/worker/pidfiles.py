"""Pid files of the workers (``<key>.pid``: JSON naming the worker process) and the checks that
tell a live worker from a dead one or from an unrelated process that reused its pid. Standard
library only."""

from __future__ import annotations

import json
import os
from pathlib import Path

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (client start-up)
if TYPE_CHECKING:
    from typing import Any

from ..procs import pid_alive
from ..sysutil import atomic_write_json


def is_worker_process(pid: int, key: str | None = None) -> bool:
    """Whether ``pid`` is a live worker process (for ``key`` if given), not an unrelated
    process that reused a dead worker's pid. Without /proc, only liveness is checked."""
    if not pid_alive(pid):
        return False
    if not Path("/proc/self").exists():
        return True
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except FileNotFoundError:
        return False              # exited meanwhile
    except OSError:
        return True
    if not any(argv):
        # an exiting process has already released its memory, so its command line reads
        # empty while the pid still exists: it is still our worker until it is gone
        return pid_alive(pid)
    if b"safetyrepro.worker" not in argv and not any(a.endswith(b"safetyrepro") for a in argv):
        return False
    return key is None or key.encode() in argv


def process_start_time(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (field 22 of /proc/PID/stat), which
    tells a process from a later one that reused its pid; None if it does not exist."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def write_pid_file(path: Path, info: dict[str, Any]) -> None:
    """Write a worker's pid file, private (0600), atomically; a link planted at ``path`` is
    replaced, not followed."""
    atomic_write_json(path, info, mode=0o600)


def read_pid_file(path: Path) -> dict[str, Any] | None:
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(info, dict) or not isinstance(info.get("pid"), int):
        return None
    return info


def remove_if_owned(path: Path, pid: int) -> bool:
    """Remove the pid file ``path`` if it still names ``pid`` (a successor may own it now)."""
    info = read_pid_file(path)
    if info is not None and info.get("pid") == pid:
        try:
            path.unlink()
            return True
        except FileNotFoundError:
            return False
    return False


def list_pid_files(state_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """The pid files of a state dir, each as its JSON plus ``path`` and ``alive``."""
    out = []
    d = Path(state_dir)
    if not d.is_dir():
        return out
    for p in sorted(d.glob("*.pid")):
        info = read_pid_file(p)
        if info is None:
            continue
        info["path"] = str(p)
        info["alive"] = is_worker_process(info["pid"], info.get("key"))
        out.append(info)
    return out
