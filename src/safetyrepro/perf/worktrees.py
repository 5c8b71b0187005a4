"""Temporary git work trees of this project for the benchmarks that run two revisions side by
side (bench_slice, bench_test_suite, bench_client_start): a revision checked out detached into
a folder, and removed again."""

from __future__ import annotations

import subprocess
from pathlib import Path

from ..paths import PROJECT_ROOT


def checkout(rev: str, folder: Path) -> str:
    """``rev`` of this project checked out (detached) at ``folder``; returns its full commit."""
    sha = subprocess.run(["git", "-C", str(PROJECT_ROOT), "rev-parse", rev], check=True,
                         capture_output=True, text=True).stdout.strip()
    subprocess.run(["git", "-C", str(PROJECT_ROOT), "worktree", "add", "--detach", "-q", str(folder), sha],
                   check=True)
    return sha


def remove(folder: Path) -> None:
    """Remove a work tree made by :func:`checkout` (best effort: used in ``finally`` blocks)."""
    subprocess.run(["git", "-C", str(PROJECT_ROOT), "worktree", "remove", "--force", str(folder)], check=False)
