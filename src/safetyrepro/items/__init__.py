"""Benchmark items: canonical schema, loaders (local files and hub), fixed stratified
subsets, few-shot pools and stratified subsamples.

Names are imported lazily so that importing the CLI (which registers the ``items`` command)
does not pull in pandas."""

import importlib

_EXPORTS = {
    "build_items": "build", "load_benchmark": "build", "read_items": "build",
    "KNOWN_BENCHMARKS": "schema", "STRATA": "schema", "ItemsError": "schema",
    "UnknownCategoryError": "schema", "item_meta": "schema",
    "stratified_subsample": "subsample",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
