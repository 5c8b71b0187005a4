"""Fixed item subsets and few-shot pools: stratified, seeded, identical on every machine.

Strata are allocated by :func:`allocate` (also used by the robustness subsamples); within a
stratum items are taken in sha256(items_seed, item_id) order, which depends on neither file
order nor the other strata. Few-shot pools: :func:`select_fewshot`.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Callable, Hashable, Iterable, Mapping, Sequence

import pandas as pd

from ..hashing import canonical_hash
from .schema import FEWSHOT_SIZE, ItemsError
from .seeding import hash_order, stable_int


def largest_remainder(weights: Mapping[Hashable, int], n: int,
                      tie: Callable[[Hashable], object]) -> dict:
    """Split ``n`` in proportion to integer ``weights`` (Hamilton's method, exact integers);
    equal remainders go first to the smaller ``tie(key)``."""
    total = sum(weights.values())
    if total == 0:
        if n:
            raise ValueError(f"cannot allocate {n} items to strata of total size 0")
        return {k: 0 for k in weights}
    alloc = {k: n * w // total for k, w in weights.items()}
    rem = {k: n * w % total for k, w in weights.items()}
    left = n - sum(alloc.values())
    for k in sorted(weights, key=lambda k: (-rem[k], tie(k)))[:left]:
        alloc[k] += 1
    return alloc


def _nested(leaves: Mapping[tuple, int], n: int, seed: int, depth: int) -> dict[tuple, int]:
    groups: dict[tuple, dict[tuple, int]] = defaultdict(dict)
    for key, size in leaves.items():
        groups[key[:depth + 1]][key] = size
    shares = largest_remainder({g: sum(v.values()) for g, v in groups.items()}, n,
                               tie=lambda g: stable_int("stratum-tie", seed, "/".join(g)))
    out: dict[tuple, int] = {}
    for g, members in groups.items():
        if len(g) == len(next(iter(members))):  # the group is a leaf
            out[g] = shares[g]
        else:
            out.update(_nested(members, shares[g], seed, depth + 1))
    return out


def allocate(sizes: Mapping[str, int], n: int, *, seed: int) -> dict[str, int]:
    """How many items to take from each stratum of ``sizes`` for ``n`` in all.

    Largest-remainder (Hamilton) shares in exact integer arithmetic; if that leaves a stratum
    empty although ``n`` >= the number of strata, every stratum gets one first. Strata with
    levels ("Age/ambig") are allocated level by level, so the top level stays proportional for
    small ``n`` (XSTest n=12: 7 safe / 5 unsafe). Equal remainders are broken by a seeded hash
    of the stratum name, never by name order, so no stratum is systematically favoured."""
    sizes = {str(s): int(c) for s, c in sizes.items()}
    if any(c <= 0 for c in sizes.values()):
        raise ValueError(f"empty strata: {[s for s, c in sizes.items() if c <= 0]}")
    total = sum(sizes.values())
    if not 0 <= n <= total:
        raise ValueError(f"cannot take {n} items from {total}")
    if not sizes:
        return {}
    depth = max(len(s.split("/")) for s in sizes)
    padded = {s: tuple(s.split("/")) + ("",) * (depth - len(s.split("/"))) for s in sizes}

    def proportional(base: int) -> dict[str, int]:
        rest = _nested({padded[s]: sizes[s] - base for s in sizes}, n - base * len(sizes),
                       seed, 0)
        return {s: base + rest[padded[s]] for s in sorted(sizes)}

    alloc = proportional(0)
    if n >= len(sizes) and min(alloc.values()) == 0:
        alloc = proportional(1)
    return alloc


def select_subset(items: pd.DataFrame, n: int, *, seed: int) -> pd.DataFrame:
    """The stratified subset of ``n`` items (rows kept in source order)."""
    alloc = allocate(Counter(items["stratum"]), n, seed=seed)
    chosen: set[str] = set()
    for stratum, k in alloc.items():
        ids = items.loc[items["stratum"] == stratum, "item_id"].tolist()
        chosen.update(ids[i] for i in hash_order(ids, "items-subset", seed)[:k])
    return items[items["item_id"].isin(chosen)].reset_index(drop=True)


def fewshot_balance(benchmark: str, items: pd.DataFrame) -> pd.Series | None:
    """The label the few-shot pool is balanced on, or None (uniform)."""
    if benchmark in ("toxigen", "xstest"):
        return items["label"]
    if benchmark == "bbq":  # context_condition
        return items["stratum"].str.split("/").str[1]
    return None


def select_fewshot(candidates: pd.DataFrame, *, seed: int, balance: pd.Series | None = None,
                   k: int = FEWSHOT_SIZE, benchmark: str = "") -> pd.DataFrame:
    """``k`` ordered exemplars from ``candidates`` (the items left after the evaluated subset;
    ToxiGen: the train split), in a seeded hash order. With ``balance`` they alternate between
    its values in sorted order (ToxiGen benign, toxic, ...), so the first 3 (the 3-shot prompt)
    are as balanced as 3 can be. Raises ItemsError when fewer than ``k`` are left."""
    ids = candidates["item_id"].tolist()
    order = hash_order(ids, "items-fewshot", seed)
    if balance is None:
        picks = [ids[i] for i in order[:k]]
    else:
        keys = list(balance)
        queues = {v: [ids[i] for i in order if keys[i] == v] for v in sorted(set(keys))}
        picks = []
        while len(picks) < k and any(queues.values()):
            for v in queues:
                if queues[v] and len(picks) < k:
                    picks.append(queues[v].pop(0))
    if len(picks) < k:
        raise ItemsError(f"{benchmark}: only {len(picks)} items left for the {k}-item few-shot "
                         f"pool; lower benchmarks.{benchmark}.n_items")
    pos = {iid: i for i, iid in enumerate(ids)}
    return candidates.iloc[[pos[p] for p in picks]].reset_index(drop=True)


def check_disjoint(subset_ids: Iterable[str], pool_ids: Iterable[str], benchmark: str) -> None:
    overlap = sorted(set(subset_ids) & set(pool_ids))
    if overlap:
        raise ItemsError(f"{benchmark}: few-shot pool overlaps the evaluated subset "
                         f"({', '.join(overlap[:5])}{' ...' if len(overlap) > 5 else ''})")


def subset_hash(benchmark: str, item_ids: Iterable[str], sources: Sequence[Mapping],
                items_seed: int) -> str:
    """sha256 over the benchmark name, the sorted item ids, the source files' sha256 and the
    items seed (which also fixes the TruthfulQA choice order, not only which ids)."""
    return canonical_hash({
        "benchmark": benchmark,
        "item_ids": sorted(item_ids),
        "sources": sorted([s["path"], s["sha256"]] for s in sources),
        "items_seed": int(items_seed),
    })
