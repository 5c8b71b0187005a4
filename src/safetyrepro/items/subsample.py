"""Stratified subsamples of an evaluated subset (used by the robustness analysis)."""

from __future__ import annotations

import math

import pandas as pd

from .schema import ItemsError
from .seeding import hash_order
from .subsets import allocate


def stratified_subsample(items: pd.DataFrame, fraction: float, seed: int,
                         strata_col: str = "stratum") -> pd.DataFrame:
    """A seeded stratified subsample of ``round(fraction * len(items))`` rows (half up).

    Per-stratum counts follow :func:`.subsets.allocate` with ties broken by ``seed``; within a
    stratum rows are taken in sha256(seed, item_id) order (the index without an item_id
    column), so the result depends on the rows, not their order. Rows keep their input order
    and index."""
    if not 0 < fraction <= 1:
        raise ItemsError(f"subsample fraction must be in (0, 1], got {fraction}")
    if strata_col not in items.columns:
        raise ItemsError(f"no column {strata_col!r} to stratify on; columns: "
                         f"{list(items.columns)}")
    if items.empty:
        return items.copy()
    keys = (items["item_id"] if "item_id" in items.columns else items.index.to_series())
    keys = keys.astype(str).tolist()
    if len(set(keys)) != len(keys):
        raise ItemsError("stratified_subsample: item ids (or index values) are not unique")
    strata = items[strata_col].astype(str).tolist()
    n = math.floor(fraction * len(items) + 0.5)
    sizes: dict[str, int] = {}
    for s in strata:
        sizes[s] = sizes.get(s, 0) + 1
    alloc = allocate(sizes, n, seed=seed)
    chosen = set()
    for stratum, k in alloc.items():
        members = [i for i, s in enumerate(strata) if s == stratum]
        order = hash_order([keys[i] for i in members], "items-subsample", seed)
        chosen.update(members[j] for j in order[:k])
    return items.iloc[sorted(chosen)]
