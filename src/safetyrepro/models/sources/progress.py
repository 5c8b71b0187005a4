"""Progress messages of a model preparation, on stderr."""

from __future__ import annotations

import sys


def log(progress: bool, msg: str) -> None:
    if progress:
        print(f"[prepare-model] {msg}", file=sys.stderr, flush=True)
