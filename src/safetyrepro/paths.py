"""Where things live. The schemas and the default envelope are package data (installed with
the package); relative paths in a run config resolve against the config file's folder
(:meth:`safetyrepro.config.RunConfig.resolve`), other relative paths against the working
directory. PROJECT_ROOT is the source checkout and only means something when running from one."""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
PROJECT_ROOT = PACKAGE_DIR.parent.parent  # src/safetyrepro -> the checkout (editable/src layout)
DATA_DIR = PACKAGE_DIR / "data"
SCHEMA_DIR = DATA_DIR / "schema"
DEFAULT_ENVELOPE = DATA_DIR / "envelope.yaml"  # config/envelope.yaml in the checkout links here
TASKS_DIR = PACKAGE_DIR / "tasks"


def resolve(path: str | os.PathLike, base: str | os.PathLike | None = None) -> Path:
    """Resolve ``path`` against ``base`` (default: the working directory) unless absolute."""
    p = Path(os.path.expanduser(str(path)))
    if p.is_absolute():
        return p
    return (Path(base) if base is not None else Path.cwd()) / p
