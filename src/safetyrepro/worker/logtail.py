"""The end of a worker's log (``<key>.log``, its stdout and stderr), quoted in error messages.
Standard library only."""

from __future__ import annotations

import os


def log_tail(path: str | os.PathLike, lines: int = 30, max_chars: int = 4000) -> str:
    """The last lines of a worker log, for error messages."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 64 * 1024))
            text = fh.read().decode("utf-8", errors="replace")
    except OSError:
        return f"(no log at {path})"
    tail = "\n".join(text.rstrip("\n").splitlines()[-lines:])
    if len(tail) > max_chars:
        tail = "..." + tail[-max_chars:]
    return tail or "(log is empty)"
