"""The Python API: read other harnesses' per-item results into one score table, to certify
with ``safetyrepro.certify(df)`` (:func:`safetyrepro.certify.certify_table`). Exposed at the
package top level (``safetyrepro.read_lmeval(folder)``); every function raises the same
DataError the CLI reports."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

    from .crosspkg.importers import ImportResult

PathLike = str | os.PathLike


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
    from .crosspkg.importers import import_lmeval  # deferred: pandas; import safetyrepro stays light

    return _table(import_lmeval(_paths(paths), metric, benchmark, filter_name))


def read_inspect(paths: PathLike | Iterable[PathLike], metric: str | None = None,
                 benchmark: str | None = None) -> "pd.DataFrame":
    """Inspect eval logs (``.eval``/``.json``) or folders of them -> the item-level table."""
    from .crosspkg.importers import import_inspect  # deferred: pandas; import safetyrepro stays light

    return _table(import_inspect(_paths(paths), metric, benchmark))


def read_helm(paths: PathLike | Iterable[PathLike], metric: str | None = None,
              benchmark: str | None = None) -> "pd.DataFrame":
    """HELM run folders (or suite folders above them) -> the item-level table; reads HELM's
    JSON files alone (crfm-helm need not be installed)."""
    from .crosspkg.importers import import_helm  # deferred: pandas; import safetyrepro stays light

    return _table(import_helm(_paths(paths), metric, benchmark))
