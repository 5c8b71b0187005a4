"""Processes on this node: whether one has finished exiting (Linux /proc).

One definition serves the worker state (is a worker gone, is its device lock free) and the
temp-file sweep (is a writer gone): a process is alive until its exit is complete, that is
until its last thread is gone, because only then are its descriptors (and the flocks on them)
closed."""

from __future__ import annotations

import os
from pathlib import Path


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists and has not finished exiting.

    A zombie thread-group leader counts as alive while other threads of its process exist:
    its descriptors (and the flocks on them, such as a worker's device lock) close only when
    the last thread is gone. A zombie with no thread left is dead; a process of another user
    counts as alive."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X"):
            return True
        return any(t != str(pid) for t in os.listdir(f"/proc/{pid}/task"))
    except FileNotFoundError:
        return False               # reaped between the two reads
    except (OSError, IndexError):
        return True
