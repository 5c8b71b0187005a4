"""Where things live: the project root (the checkout holding config/ and the Snakefile)."""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
PROJECT_ROOT = PACKAGE_DIR.parent.parent  # src/safetyrepro -> project root (editable/src layout)
SCHEMA_DIR = PROJECT_ROOT / "config" / "schema"
DEFAULT_ENVELOPE = PROJECT_ROOT / "config" / "envelope.yaml"
TASKS_DIR = PACKAGE_DIR / "tasks"


def resolve(path: str | os.PathLike, base: str | os.PathLike | None = None) -> Path:
    """Resolve ``path`` against ``base`` (default: the project root) unless absolute."""
    p = Path(os.path.expanduser(str(path)))
    if p.is_absolute():
        return p
    return (Path(base) if base is not None else PROJECT_ROOT) / p
