"""Copies of the repository's run configs for tests that write them elsewhere (a temp folder).

A config's relative paths are relative to its own folder, so a copy written somewhere else gets
them absolute: the copy then points at the same envelope, data, resources and results folders."""

from __future__ import annotations

from pathlib import Path

import yaml

PATH_KEYS = (("envelope", "rules"), ("data", "local_dir"), ("runtime", "resources_dir"),
             ("runtime", "results_dir"))


def absolute_paths(raw: dict, folder: Path) -> dict:
    """``raw`` (a parsed config from ``folder``) with its relative paths made absolute."""
    for section, key in PATH_KEYS:
        value = raw.get(section, {}).get(key)
        if value is not None and not Path(value).is_absolute():
            raw[section][key] = str((folder / value).resolve())
    for spec in raw.get("models", {}).values():
        source = spec.get("source", {})
        if source.get("kind") == "local" and not Path(source["path"]).is_absolute():
            source["path"] = str((folder / source["path"]).resolve())
    return raw


def config_copy(path: Path) -> dict:
    """The config at ``path``, parsed, with absolute paths (ready to be written elsewhere)."""
    path = Path(path)
    return absolute_paths(yaml.safe_load(path.read_text()), path.absolute().parent)
