"""Copies of the repository's run configs for tests that write them elsewhere (a temp folder).

A config's relative paths are relative to its own folder, so a copy written somewhere else gets
them absolute: the copy then points at the same envelope, data, resources and results folders."""

from __future__ import annotations

from pathlib import Path

import yaml

from safetyrepro.config import PATH_KEYS, absolute_paths  # noqa: F401  (re-exported for the tests)


def config_copy(path: Path) -> dict:
    """The config at ``path``, parsed, with absolute paths (ready to be written elsewhere)."""
    path = Path(path)
    return absolute_paths(yaml.safe_load(path.read_text()), path.absolute().parent)
