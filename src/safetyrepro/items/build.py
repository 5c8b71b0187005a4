"""Load a benchmark, draw its fixed subset and few-shot pool, write them as Parquet."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Sequence

import pandas as pd

from ..config import DEFAULTS, RunConfig
from ..errors import ConfigError, SafetyReproError
from ..hashing import canonical_hash
from ..io import read_metadata, read_parquet, write_parquet
from ..provenance import code_version
from . import hub, loaders
from .schema import (EVAL_SPLIT, FEWSHOT_SIZE, FEWSHOT_SPLIT, STRATA, ItemsError,
                     UnknownCategoryError, check_benchmark, make_frame, to_arrow)
from .subsets import check_disjoint, fewshot_balance, select_fewshot, select_subset, subset_hash

DEFAULT_ITEMS_SEED: int = DEFAULTS["data"]["items_seed"]
SOURCES = ("local", "hub")


def _load(name: str, data_dir: Path, source: str, categories, items_seed: int
          ) -> tuple[pd.DataFrame, list[dict]]:
    check_benchmark(name)
    if source not in SOURCES:
        raise ItemsError(f"unknown data source {source!r}; use 'local' or 'hub' (data.source)")
    if categories is not None and name != "bbq":
        raise UnknownCategoryError(f"categories apply to bbq only, not {name}")
    if source == "local":
        records, sources = loaders.load_local(name, Path(data_dir), categories=categories,
                                              items_seed=items_seed)
    else:
        records, sources = hub.load_hub(name, categories=categories, items_seed=items_seed)
    return make_frame(records, name), sources


def load_benchmark(name: str, data_dir: Path, *, source: str = "local",
                   categories: Sequence[str] | None = None,
                   items_seed: int = DEFAULT_ITEMS_SEED) -> pd.DataFrame:
    """All items of a benchmark (every split) in the canonical schema (schema.py).

    ``categories`` selects BBQ categories (default: the six present locally).
    ``items_seed`` fixes the TruthfulQA choice shuffle. The source files and their sha256
    are in ``df.attrs["sources"]``."""
    df, sources = _load(name, data_dir, source, categories, items_seed)
    df.attrs["sources"] = sources
    return df


def items_paths(out_dir: Path, benchmark: str) -> tuple[Path, Path]:
    return Path(out_dir) / f"{benchmark}.parquet", Path(out_dir) / f"{benchmark}.fewshot.parquet"


def build_items(cfg: RunConfig, benchmark: str, out_dir: Path | None = None,
                write: bool = True) -> dict:
    """Write ``<out_dir>/<benchmark>.parquet`` (the evaluated subset) and
    ``<benchmark>.fewshot.parquet`` (5 ordered exemplars) with provenance metadata;
    ``out_dir`` defaults to ``<results_dir>/items``. Files already holding the same content
    (``content_hash``) are left untouched; a failed build leaves the previous files as they
    were; ``write=False`` only computes. Returns a summary dict."""
    check_benchmark(benchmark)
    if benchmark not in cfg.benchmarks:
        raise ConfigError(cfg.path, "benchmarks", f"{benchmark!r} is not configured; "
                                                  f"configured: {', '.join(cfg.benchmarks)}")
    bcfg = cfg.benchmark(benchmark)
    n_items = int(bcfg["n_items"])
    categories = bcfg.get("categories")
    data = cfg.data["data"]
    seed, source = int(data["items_seed"]), data["source"]
    try:
        df, sources = _load(benchmark, cfg.data_dir, source, categories, seed)
    except UnknownCategoryError as exc:
        raise ConfigError(cfg.path, f"benchmarks.{benchmark}.categories", str(exc)) from None

    evaluable = df[df["split"] == EVAL_SPLIT[benchmark]].reset_index(drop=True)
    pool_split = FEWSHOT_SPLIT[benchmark]
    spare = 0 if pool_split != EVAL_SPLIT[benchmark] else FEWSHOT_SIZE
    if n_items + spare > len(evaluable):
        raise ConfigError(cfg.path, f"benchmarks.{benchmark}.n_items",
                          f"{n_items} requested but {benchmark} has {len(evaluable)} "
                          f"'{EVAL_SPLIT[benchmark]}' items"
                          + (f", of which {FEWSHOT_SIZE} must stay out for the few-shot "
                             f"pool" if spare else ""))
    subset = select_subset(evaluable, n_items, seed=seed)
    candidates = df[(df["split"] == pool_split) & ~df["item_id"].isin(subset["item_id"])]
    candidates = candidates.reset_index(drop=True)
    fewshot = select_fewshot(candidates, seed=seed, benchmark=benchmark,
                             balance=fewshot_balance(benchmark, candidates))
    check_disjoint(subset["item_id"], fewshot["item_id"], benchmark)

    shash = subset_hash(benchmark, subset["item_id"], sources, seed)
    strata = dict(sorted(Counter(subset["stratum"]).items()))
    meta = {
        "benchmark": benchmark,
        "subset_hash": shash,
        "n_items": n_items,
        "items_seed": seed,
        "data_source": source,
        "sources": sources,
        "categories": sorted(set(df["stratum"].str.split("/").str[0])) if benchmark == "bbq"
        else None,
        "strata": strata,
        "stratum_rule": STRATA[benchmark],
        "fewshot_ids": fewshot["item_id"].tolist(),
        "code_version": code_version(),
        "config_hash": cfg.hash,
        "config_path": cfg.path,
    }
    items_path, fewshot_path = items_paths(
        Path(out_dir) if out_dir is not None else cfg.results_dir / "items", benchmark)
    items_tbl, fewshot_tbl = to_arrow(subset, benchmark), to_arrow(fewshot, benchmark)
    # What the cells read: every row of both files (not the code version). Files that hold
    # it already are left untouched, so an items-code edit that changes nothing leaves their
    # modification times, and every cell computed from them, alone.
    meta["content_hash"] = canonical_hash({"items": items_tbl.to_pylist(),
                                           "fewshot": fewshot_tbl.to_pylist(), "meta": {
                                               k: v for k, v in meta.items() if k not in
                                               ("code_version", "config_path", "config_hash")}})
    summary = {"benchmark": benchmark, "n_items": len(subset), "strata": strata,
               "subset_hash": shash, "content_hash": meta["content_hash"],
               "fewshot_ids": fewshot["item_id"].tolist(),
               "sources": sources, "items_path": items_path, "fewshot_path": fewshot_path}
    if not write:
        return summary
    if _content_hash(items_path) == _content_hash(fewshot_path) == meta["content_hash"]:
        return summary | {"unchanged": True}
    # Both files are written to temporary names first and renamed into place only when both
    # are complete: a failed rebuild leaves the previous (good) pair as it was.
    new_fewshot = fewshot_path.with_name(f".{fewshot_path.name}.new")
    new_items = items_path.with_name(f".{items_path.name}.new")
    try:
        write_parquet(fewshot_tbl, new_fewshot,
                      {**meta, "kind": "fewshot", "n_fewshot": len(fewshot),
                       "fewshot_note": "ordered; k-shot prompts use the first k exemplars"})
        write_parquet(items_tbl, new_items, {**meta, "kind": "items"})
        os.replace(new_fewshot, fewshot_path)
        os.replace(new_items, items_path)
    finally:
        for p in (new_fewshot, new_items):
            p.unlink(missing_ok=True)
    return summary | {"unchanged": False}


def _content_hash(path: Path) -> str | None:
    """The ``content_hash`` an items or few-shot file records (None if absent/unreadable)."""
    try:
        return read_metadata(path).get("content_hash")
    except SafetyReproError:
        return None


def read_items(path: str | Path) -> tuple[pd.DataFrame, dict]:
    """An items (or few-shot) Parquet as a DataFrame plus its metadata. ``choices`` are
    python lists; ``meta`` stays a JSON string (decode a row's with schema.item_meta)."""
    table, meta = read_parquet(path)
    df = table.to_pandas()
    df["choices"] = [list(c) for c in df["choices"]]
    return df, meta
