"""JSON-Schema validation of YAML inputs with one clear error naming file and field."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from .errors import ConfigError
from .paths import SCHEMA_DIR


@functools.lru_cache(maxsize=None)
def load_schema(name: str) -> dict:
    path = SCHEMA_DIR / f"{name}.schema.json"
    return json.loads(path.read_text())


def _field_path(err: jsonschema.ValidationError) -> str:
    parts = [str(p) for p in err.absolute_path]
    return ".".join(parts) if parts else "(top level)"


def validate(obj: Any, schema_name: str, source: str | Path) -> None:
    """Raise ConfigError for the first (most specific) schema violation."""
    validator = jsonschema.Draft202012Validator(load_schema(schema_name))
    errors = sorted(validator.iter_errors(obj), key=lambda e: (len(list(e.absolute_path)), e.message))
    if errors:
        best = jsonschema.exceptions.best_match(errors)
        raise ConfigError(source, _field_path(best), f"{best.message} (schema: {schema_name})")


def load_yaml(path: str | Path) -> Any:
    path = Path(path)
    if not path.exists():
        raise ConfigError(path, None, "file not found")
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ConfigError(path, None, f"not valid YAML: {exc}") from exc
