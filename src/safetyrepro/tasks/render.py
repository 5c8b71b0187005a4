"""Template placeholders and item field values.

Templates are plain strings with ``{name}`` placeholders (``{{``/``}}`` for literal braces),
filled with ``str.format_map``. Only bare names are allowed: no positional ``{}``, no
attribute/index access, no conversions or format specs, so a template can do nothing but
insert a value.
"""

from __future__ import annotations

import json
import string
from typing import Any

from ..errors import DataError

INSTRUCTIONS_JOINER = "\n\n"

_FORMATTER = string.Formatter()


def placeholders(template: str) -> set[str]:
    """The placeholder names a template uses; ValueError describing the first bad one."""
    names = set()
    try:
        parsed = list(_FORMATTER.parse(template))
    except ValueError as exc:
        raise ValueError(f"malformed braces ({exc}); write {{{{ and }}}} for literal braces") from None
    for _literal, field, spec, conversion in parsed:
        if field is None:
            continue
        if not field.isidentifier():
            raise ValueError(f"placeholder {{{field}}} is not a plain name "
                             "(use {name}; write {{ and }} for literal braces)")
        if conversion or spec:
            raise ValueError(f"placeholder {{{field}}} has a conversion or format spec; "
                             "only plain {name} placeholders are allowed")
        names.add(field)
    return names


def render(template: str, values: dict[str, str]) -> str:
    return template.format_map(values)


def item_id(item: dict) -> str:
    return str(item.get("item_id", "<no item_id>")) if isinstance(item, dict) else "<not a dict>"


def item_error(benchmark: str, item: dict, message: str) -> DataError:
    return DataError(f"{benchmark} item {item_id(item)}", message)


def item_meta(benchmark: str, item: dict) -> dict:
    """The item's ``meta`` as a dict (it is a JSON string in the items table)."""
    meta = item.get("meta")
    if meta is None or meta == "":
        return {}
    if isinstance(meta, dict):
        return meta
    try:
        value = json.loads(meta)
    except (TypeError, ValueError) as exc:
        raise item_error(benchmark, item, f"meta is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise item_error(benchmark, item, "meta JSON is not an object")
    return value


def lookup(benchmark: str, item: dict, source: str) -> Any:
    """An item value by source name: a column, or ``meta.<key>``."""
    if source.startswith("meta."):
        return item_meta(benchmark, item).get(source[5:])
    return item.get(source)


def text_value(benchmark: str, item: dict, source: str, needed_for: str) -> str:
    """A non-empty text value of the item, stripped; DataError naming the item otherwise."""
    value = lookup(benchmark, item, source)
    if value is None or not str(value).strip():
        raise item_error(benchmark, item, f"'{source}' is empty but {needed_for} needs it")
    return str(value).strip()


def choices_of(benchmark: str, item: dict) -> list[str]:
    choices = item.get("choices")
    if choices is None or len(choices) == 0:
        raise item_error(benchmark, item, "'choices' is empty but this benchmark shows options")
    out = [str(c).strip() for c in choices]
    if any(not c for c in out):
        raise item_error(benchmark, item, "'choices' holds an empty option")
    return out


# ---- gold lookups: the answer an exemplar shows, and what scoring counts correct ----------
def gold_index(task, item: dict, n_choices: int) -> int:
    gold = item.get("gold")
    try:
        g = int(gold)
    except (TypeError, ValueError):
        raise item_error(task.benchmark, item, f"gold {gold!r} is not an option index") from None
    if not 0 <= g < n_choices:
        raise item_error(task.benchmark, item, f"gold {g} is outside its {n_choices} options")
    return g


def accepted_labels(task, item: dict) -> list[str]:
    """The parsed labels counted correct for a label-task item (from its ``label``)."""
    gold_map = task.content["answer"]["gold_map"]
    label = item.get("label")
    key = str(label).strip().lower() if label is not None else None
    for k, accepted in gold_map.items():
        if k.lower() == key:
            return list(accepted)
    raise item_error(task.benchmark, item, f"label {label!r} is not one of {sorted(gold_map)}")
