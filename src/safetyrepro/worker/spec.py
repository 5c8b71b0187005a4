"""What a worker holds: the identity (spec hash) of its loaded state, covering the code that
loaded it, so a worker started before the sources changed is replaced. Standard library only."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (client start-up)
if TYPE_CHECKING:
    from typing import Any

SOURCE_SUFFIXES = (".py", ".yaml", ".yml", ".json")  # provenance.SOURCE_SUFFIXES (stdlib-only here)


def installed_sources_stamp(package_dir: str | os.PathLike | None = None) -> str:
    """A cheap fingerprint of the installed ``safetyrepro`` sources (path, size and mtime of
    every .py file and of the package's data files: task .yaml, .json). A worker started
    before the code changed is replaced, so a shard is never computed by stale code under a
    new code version (the cell fingerprint check in :func:`safetyrepro.cells.run_cell` is
    the end-to-end guarantee)."""
    root = Path(package_dir) if package_dir is not None else Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    stack = [root]
    entries = []
    while stack:
        d = stack.pop()
        try:
            with os.scandir(d) as it:
                for e in it:
                    if e.is_dir(follow_symlinks=False) and e.name != "__pycache__":
                        stack.append(Path(e.path))
                    elif e.name.endswith(SOURCE_SUFFIXES):
                        st = e.stat()
                        entries.append(f"{e.path}:{st.st_size}:{st.st_mtime_ns}")
        except OSError:
            continue
    for line in sorted(entries):
        h.update(line.encode("utf-8", "surrogateescape"))
    return h.hexdigest()[:16]


def spec_hash(loader: str, loader_args: dict[str, Any], stamp: str | None = None) -> str:
    """Identity of the state a worker holds: what it loads, with which arguments, by which
    code (``stamp``, default :func:`installed_sources_stamp`)."""
    blob = json.dumps({"loader": loader, "loader_args": loader_args,
                       "code": stamp if stamp is not None else installed_sources_stamp()}, sort_keys=True,
                      separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]
