"""JSON-Schema validation of YAML inputs with one clear error naming file and field.

Stricter than plain JSON Schema where Python's reading of it lets nonsense through: a
``number`` is finite, an ``integer`` is a Python int (``2.0`` would break ``range``), a
``pattern``'s ``$`` anchors only at the very end (Python's ``$`` also matches before a final
newline), and mapping keys are strings. The config is checked on load, before any job runs."""

from __future__ import annotations

import functools
import json
import math
import re
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


def _is_integer(_checker, v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(_checker, v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _end_anchored(pattern: str) -> str:
    """``pattern`` with each ``$`` anchor (outside a character class, unescaped) as ``\\Z``."""
    out, i, in_class = [], 0, False
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            out.append(pattern[i:i + 2])
            i += 2
            continue
        if in_class:
            in_class = ch != "]"
        elif ch == "[":
            in_class = True
        elif ch == "$":
            ch = r"\Z"
        out.append(ch)
        i += 1
    return "".join(out)


@functools.lru_cache(maxsize=None)
def _compiled(pattern: str) -> re.Pattern:
    return re.compile(_end_anchored(pattern))


def _pattern(_validator, pattern, instance, _schema):
    if isinstance(instance, str) and not _compiled(pattern).search(instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


_Validator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator,
    validators={"pattern": _pattern},
    type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine_many(
        {"integer": _is_integer, "number": _is_number}))


def _message(err: jsonschema.ValidationError) -> str:
    v = err.instance
    if err.validator == "type" and isinstance(v, float) and not math.isfinite(v):
        return f"{v!r} is not a finite number"
    if err.validator == "type" and err.validator_value == "integer" and isinstance(v, float):
        return f"{v!r} is not an integer (write it without a decimal point)"
    if err.validator == "type" and err.validator_value in ("number", "integer") and isinstance(v, str):
        try:
            float(v)
            return f"{err.message} (YAML reads a number like 1e9 as text: write 1.0e+9)"
        except ValueError:
            pass
    return err.message


def validate(obj: Any, schema_name: str, source: str | Path) -> None:
    """Raise ConfigError for the first (most specific) schema violation."""
    validator = _Validator(load_schema(schema_name))
    errors = sorted(validator.iter_errors(obj), key=lambda e: (len(list(e.absolute_path)), e.message))
    if errors:
        best = jsonschema.exceptions.best_match(errors)
        raise ConfigError(source, _field_path(best), f"{_message(best)} (schema: {schema_name})")


MAX_DEPTH = 64   # no config nests deeper; a YAML alias cycle (a: &x [*x]) would be endless


def _check_keys(obj: Any, path: Path, where: str = "", depth: int = 0) -> None:
    """Every mapping key a string (YAML reads ``1:`` or ``yes:`` as a number or a boolean),
    nesting bounded (which also refuses a structure that contains itself)."""
    if depth > MAX_DEPTH:
        raise ConfigError(path, where, f"nested more than {MAX_DEPTH} levels deep (or a YAML alias that "
                                       "contains itself)")
    if isinstance(obj, dict):
        for k, v in obj.items():
            if not isinstance(k, str):
                raise ConfigError(path, where or "(top level)",
                                  f"key {k!r} is a {type(k).__name__}, not a name (quote it)")
            _check_keys(v, path, f"{where}.{k}" if where else k, depth + 1)
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            _check_keys(v, path, f"{where}.{i}" if where else str(i), depth + 1)


def load_yaml(path: str | Path) -> Any:
    path = Path(path)
    if not path.exists():
        raise ConfigError(path, None, "file not found")
    if not path.is_file():
        raise ConfigError(path, None, "not a file (a folder?)")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(path, None, f"not UTF-8 text (byte {exc.start}: {exc.reason}); "
                                      "is it a binary file?") from None
    except OSError as exc:
        raise ConfigError(path, None, f"cannot read: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(path, None, f"not valid YAML: {exc}") from exc
    except RecursionError:
        raise ConfigError(path, None, "not valid YAML: nested too deeply") from None
    _check_keys(data, path)
    return data
