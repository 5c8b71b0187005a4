"""Benchmark items (issue 3): canonical schema, loaders (local files and hub), fixed
stratified subsets, few-shot pools, and stratified subsamples.

See schema.py (columns), normalize.py (per-benchmark encoding of gold/label/meta),
subsets.py (allocation and few-shot rules)."""

from .build import build_items, load_benchmark, read_items
from .schema import KNOWN_BENCHMARKS, STRATA, ItemsError, UnknownCategoryError, item_meta
from .subsample import stratified_subsample

__all__ = ["KNOWN_BENCHMARKS", "STRATA", "ItemsError", "UnknownCategoryError", "build_items",
           "item_meta", "load_benchmark", "read_items", "stratified_subsample"]
