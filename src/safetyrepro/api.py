"""The Python API: certify a score table you already have, and read other harnesses' per-item
results into one. Exposed at the package top level (``safetyrepro.certify(df)``,
``safetyrepro.read_lmeval(folder)``); every function raises the same DataError the CLI reports."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

    from .certify import CertifyResult
    from .crosspkg.importers import ImportResult

PathLike = str | os.PathLike


def certify(table: "pd.DataFrame | PathLike", *, config_cols: str | Iterable[str] | None = None,
            alpha: float = 0.05, tol: float | None = None, samples: int | None = None, seed: int = 0,
            nominal: str | None = None, drop_incomplete: bool = False, family: str = "pair",
            correction: str = "maxt") -> "CertifyResult":
    """Verdict metrics of a long score table (a DataFrame, or a CSV/Parquet path): the same
    computation as ``safetyrepro certify``, whose options these are (``config_cols``: axis column
    names, a list or ``"a,b,c"``; ``samples``/``seed``: the resampling, ``samples=None`` picking
    the count; ``family``/``correction``: the multiplicity family and its correction). The result holds
    DataFrames: ``pairs``, ``summary`` (per benchmark), ``significance`` (item-level input) and
    ``reversal`` (with ``nominal``); :func:`safetyrepro.certify.to_json` gives the CLI's JSON."""
    from .certify import certify as run

    if isinstance(config_cols, str):
        config_cols = [c.strip() for c in config_cols.split(",") if c.strip()]
    cols = list(config_cols) if config_cols is not None else None
    return run(table, cols or None, drop_incomplete, tol, alpha=alpha, samples=samples, seed=seed,
               nominal=nominal, family=family, correction=correction)


def _paths(paths: PathLike | Iterable[PathLike]) -> list[Path]:
    if isinstance(paths, (str, os.PathLike)):
        return [Path(paths)]
    return [Path(p) for p in paths]


def _table(res: "ImportResult") -> "pd.DataFrame":
    """The importer's long table; its axis columns and the settings equal in every run ride
    along in ``DataFrame.attrs`` (``axes``, ``constant``)."""
    df = res.table
    df.attrs["axes"] = list(res.axes)
    df.attrs["constant"] = dict(res.constant)
    return df


def read_lmeval(paths: PathLike | Iterable[PathLike], metric: str | None = None,
                benchmark: str | None = None, filter_name: str | None = None) -> "pd.DataFrame":
    """lm-evaluation-harness output folders (``--output_path``, written with ``--log_samples``) or
    ``results_*.json`` files -> the item-level table (model, benchmark, config, item, score and
    the axis columns), ready for :func:`certify` (``config_cols=df.attrs["axes"]``). A task with
    several filter pipelines gives a ``filter`` axis unless ``filter_name`` keeps one."""
    from .crosspkg.importers import import_lmeval

    return _table(import_lmeval(_paths(paths), metric, benchmark, filter_name))


def read_inspect(paths: PathLike | Iterable[PathLike], metric: str | None = None,
                 benchmark: str | None = None) -> "pd.DataFrame":
    """Inspect eval logs (``.eval``/``.json``) or folders of them -> the item-level table."""
    from .crosspkg.importers import import_inspect

    return _table(import_inspect(_paths(paths), metric, benchmark))


def read_helm(paths: PathLike | Iterable[PathLike], metric: str | None = None,
              benchmark: str | None = None) -> "pd.DataFrame":
    """HELM run folders (or suite folders above them) -> the item-level table; reads HELM's
    JSON files alone (crfm-helm need not be installed)."""
    from .crosspkg.importers import import_helm

    return _table(import_helm(_paths(paths), metric, benchmark))
