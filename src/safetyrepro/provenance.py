"""Code version: which code produced a number. Package version, plus the git commit (and a
dirty flag) when running from a checkout, plus a hash over the package sources so that an
installed copy without git is still identifiable."""

from __future__ import annotations

import functools
import hashlib
import subprocess
from pathlib import Path

from . import __version__

PACKAGE_DIR = Path(__file__).resolve().parent


@functools.lru_cache(maxsize=None)
def source_hash() -> str:
    """sha256 over every .py/.yaml file of the package (path + bytes), in sorted order."""
    h = hashlib.sha256()
    for p in sorted(PACKAGE_DIR.rglob("*")):
        if p.suffix in {".py", ".yaml", ".yml", ".json"} and "__pycache__" not in p.parts:
            h.update(str(p.relative_to(PACKAGE_DIR)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()


@functools.lru_cache(maxsize=None)
def git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(PACKAGE_DIR), "rev-parse", "HEAD"],
            capture_output=True, text=True, timeout=5,
        )
        if out.returncode != 0:
            return None
        commit = out.stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(PACKAGE_DIR), "status", "--porcelain", "--", str(PACKAGE_DIR)],
            capture_output=True, text=True, timeout=5,
        ).stdout.strip()
        return commit + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def code_version() -> dict:
    """Provenance record of the running code."""
    return {
        "package_version": __version__,
        "git_commit": git_commit(),
        "source_sha256": source_hash(),
    }


def code_version_string() -> str:
    cv = code_version()
    commit = cv["git_commit"] or "nogit"
    return f"{cv['package_version']}+{commit[:12]}{'-dirty' if commit.endswith('-dirty') else ''}.src{cv['source_sha256'][:12]}"
