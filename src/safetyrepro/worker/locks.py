"""Exclusive file locks (``flock``) of the worker state: a worker's key lock, the start lock,
device locks, run leases; the holder records who it is inside the lock file. Standard library
only."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import time
from pathlib import Path

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (client start-up)
if TYPE_CHECKING:
    from typing import Any

from .errors import WorkerError
from .layout import STATE_DIR_ENV, open_private


class FileLock:
    """An exclusive ``flock`` on a file. Released when released, or when the process dies
    (the descriptor is close-on-exec, so child processes do not inherit it)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, timeout: float | None = None, poll: float = 0.05) -> bool:
        """Block until acquired (``timeout=None``), or give up after ``timeout`` seconds
        (``0`` = one try). Returns whether the lock is held."""
        if self._fd is not None:
            return True
        fd = open_private(self.path, os.O_RDWR | os.O_CREAT)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self._fd = fd
                return True
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    os.close(fd)
                    raise WorkerError(f"cannot lock {self.path}: {exc}; worker state needs a "
                                      f"filesystem with flock (set {STATE_DIR_ENV} to a local "
                                      "directory)") from exc
            if deadline is not None and time.monotonic() >= deadline:
                os.close(fd)
                return False
            time.sleep(poll)

    def write_holder(self, info: dict[str, Any]) -> None:
        """Record who holds the lock inside the lock file (for status and error messages)."""
        if self._fd is None:
            raise RuntimeError(f"{self.path}: lock not held")
        data = json.dumps(info, sort_keys=True).encode("utf-8")
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, data, 0)

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)

    def __enter__(self) -> "FileLock":
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def lock_is_held(path: str | os.PathLike) -> bool:
    """Whether some process holds the flock on ``path`` (tries it without waiting)."""
    probe = FileLock(path)
    if not Path(path).exists():
        return False
    if probe.acquire(timeout=0):
        probe.release()
        return False
    return True


def read_holder(path: str | os.PathLike) -> dict[str, Any] | None:
    try:
        text = Path(path).read_text(encoding="utf-8")
        return json.loads(text) if text.strip() else None
    except (OSError, ValueError):
        return None
