"""Shared plumbing of the analyses: reading the cell-score and item-result tables with
validation, provenance metadata for every output, and writing a table as Parquet + CSV.

An output's Parquet metadata copies its source table's ``rules_stamp``, ``config_hash`` and
``code_version`` and adds the analysis' own code version, source paths and parameters, so a
number can be traced to its run; the CSV beside it is a plain view of the same rows.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from ..certify import incomplete_cells
from ..errors import DataError
from ..io import read_metadata, read_parquet, write_csv, write_parquet
from ..metrics.compare import weak_ranks as _weak_ranks
from ..provenance import code_stamp, code_version_string, stale_reason
from ..rules import AXES  # noqa: F401  (defined once, in rules)
from .outputs import step_tables, table_outputs

CELL_COLUMNS = ("model", "benchmark", "config", "template", "decoding", "shots", "scoring",
                "core", "score", "parse_rate")
ITEM_COLUMNS = ("model", "benchmark", "config", "seed", "item_id", "parsed_label", "parse_ok",
                "correct", "stratum")
REQUIRED_META = ("rules_stamp", "config_hash", "code_version")
_STAMP = ("producer", "code_fingerprint")  # provenance.code_stamp
NOMINAL_CONFIG = "T1-greedy-k0-freeform"


@dataclass
class CellScores:
    """A validated cell-score table: complete configs only (see :func:`load_cell_scores`)."""

    df: pd.DataFrame
    meta: dict
    path: Path
    dropped: dict[str, list[str]] = field(default_factory=dict)  # benchmark -> configs dropped


def _check_meta(path: Path, meta: dict) -> None:
    missing = [k for k in REQUIRED_META if k not in meta]
    if missing:
        raise DataError(path, f"metadata lacks {missing}: cannot stamp analysis outputs "
                              "(was this table written by the aggregation step?)")


def validate_cells(df: pd.DataFrame, path: str | Path) -> pd.DataFrame:
    """Check columns, types, finiteness, uniqueness and config-id/axis agreement."""
    missing = [c for c in CELL_COLUMNS if c not in df.columns]
    if missing:
        raise DataError(path, f"missing column(s) {missing}; found {list(df.columns)}")
    df = df.reset_index(drop=True).copy()
    for col in ("model", "benchmark", "config", *AXES):
        if df[col].isna().any():
            raise DataError(path, f"empty '{col}'", row=int(df.index[df[col].isna()][0]))
        df[col] = df[col].astype(str)
    for col in ("score", "parse_rate"):
        vals = pd.to_numeric(df[col], errors="coerce").astype(float)
        bad = ~np.isfinite(vals.to_numpy())
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise DataError(path, f"non-numeric, NaN or infinite '{col}' ({df[col].iloc[i]!r}) for cell "
                                  f"({df['model'].iloc[i]}, {df['benchmark'].iloc[i]}, {df['config'].iloc[i]})",
                            row=i)
        df[col] = vals
    if ("score_num" in df.columns) != ("score_den" in df.columns):
        raise DataError(path, "'score_num' and 'score_den' come together (the exact score fraction)")
    if "score_num" in df.columns:
        for col in ("score_num", "score_den"):
            vals = pd.to_numeric(df[col], errors="coerce")
            bad = vals.isna() | (vals != vals.round()) | (vals < (1 if col == "score_den" else 0))
            if bad.any():
                i = int(np.flatnonzero(bad.to_numpy())[0])
                raise DataError(path, f"'{col}' must be a {'positive' if col == 'score_den' else 'non-negative'} "
                                      f"integer (got {df[col].iloc[i]!r}) for cell ({df['model'].iloc[i]}, "
                                      f"{df['benchmark'].iloc[i]}, {df['config'].iloc[i]})", row=i)
            df[col] = vals.astype(np.int64)
        ratio = df["score_num"] / df["score_den"]
        off = (ratio - df["score"]).abs() > 1e-9
        if off.any():
            i = int(np.flatnonzero(off.to_numpy())[0])
            raise DataError(path, f"'score' {df['score'].iloc[i]!r} is not score_num/score_den "
                                  f"({df['score_num'].iloc[i]}/{df['score_den'].iloc[i]}) for cell "
                                  f"({df['model'].iloc[i]}, {df['benchmark'].iloc[i]}, {df['config'].iloc[i]})", row=i)
    if df["core"].isna().any():
        raise DataError(path, "empty 'core'", row=int(df.index[df["core"].isna()][0]))
    df["core"] = df["core"].astype(bool)
    joined = df["template"] + "-" + df["decoding"] + "-" + df["shots"] + "-" + df["scoring"]
    mism = joined != df["config"]
    if mism.any():
        i = int(np.flatnonzero(mism.to_numpy())[0])
        raise DataError(path, f"config id {df['config'].iloc[i]!r} disagrees with its axis columns "
                              f"({joined.iloc[i]!r})", row=i)
    dup = df.duplicated(["model", "benchmark", "config"], keep=False)
    if dup.any():
        r = df[dup].iloc[0]
        raise DataError(path, f"duplicate cell ({r['model']}, {r['benchmark']}, {r['config']})",
                        row=int(df.index[dup][0]))
    return df


def complete_configs(df: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, list[str]]]:
    """Keep, per benchmark, only configs that every model of that benchmark has.

    The flip metrics compare models config by config, so a config with a missing cell cannot
    enter |C|. Returns the filtered table and benchmark -> sorted dropped config ids."""
    dropped = {b: sorted({c for _, c in cells}) for b, cells in incomplete_cells(df).items()}
    keep = np.ones(len(df), dtype=bool)
    for b, cfgs in dropped.items():
        keep &= ~((df["benchmark"] == b) & df["config"].isin(cfgs)).to_numpy()
    return df[keep].reset_index(drop=True), dropped


def load_cell_scores(path: str | Path) -> CellScores:
    """Read ``cell_scores.parquet``, validate it and drop incomplete configs (recorded)."""
    path = Path(path)
    table, meta = read_parquet(path)
    _check_meta(path, meta)
    df = validate_cells(table.to_pandas(), path)
    if df.empty:
        raise DataError(path, "no cells")
    df, dropped = complete_configs(df)
    if df.empty:
        raise DataError(path, "no config is complete for every model")
    return CellScores(df=df, meta=meta, path=path, dropped=dropped)


def load_item_results(path: str | Path, columns: Iterable[str] = ITEM_COLUMNS,
                      filters=None) -> tuple[pd.DataFrame, dict]:
    """Read the needed columns of ``item_results.parquet`` (optionally filtered by pyarrow)."""
    path = Path(path)
    meta = read_metadata(path)
    _check_meta(path, meta)
    columns = list(columns)
    have = pq.read_schema(path).names
    missing = [c for c in columns if c not in have]
    if missing:
        raise DataError(path, f"missing column(s) {missing}; found {have}")
    try:
        # a column subset cannot be checked against the whole-table digest; page checksums can
        df = pq.read_table(path, columns=columns, filters=filters, page_checksum_verification=True).to_pandas()
    except Exception as exc:
        raise DataError(path, f"cannot read item results ({exc})") from exc
    for col in ("model", "benchmark", "config", "item_id"):
        if col in df.columns:
            if df[col].isna().any():
                raise DataError(path, f"empty '{col}'", row=int(np.flatnonzero(df[col].isna().to_numpy())[0]))
            df[col] = df[col].astype(str)
    for col in ("parse_ok", "correct"):
        if col in df.columns:
            if df[col].isna().any():
                raise DataError(path, f"empty '{col}'", row=int(np.flatnonzero(df[col].isna().to_numpy())[0]))
            df[col] = df[col].astype(bool)
    return df, meta


def check_same_rules(a: tuple[Path, dict], b: tuple[Path, dict]) -> None:
    """Two source tables must come from the same envelope rules."""
    if a[1].get("rules_stamp") != b[1].get("rules_stamp"):
        raise DataError(b[0], f"rules_stamp {b[1].get('rules_stamp')!r} differs from "
                              f"{a[0]}'s {a[1].get('rules_stamp')!r}: tables from different envelope rules")


def source_record(path: str | Path, meta: dict) -> dict:
    """What an output records about one source table: its path, stamps and code stamp."""
    return {"path": str(path), **{k: meta.get(k) for k in (*REQUIRED_META, *_STAMP)}}


def output_metadata(table: str, sources: list[tuple[Path, dict]], params: dict | None = None,
                    extra: dict | None = None, producer: str | None = None) -> dict:
    """Provenance record for an analysis output: stamps copied from the first source, and the
    code stamp (``producer`` module and its code fingerprint; the producer defaults to the
    calling module, the one that computes the table) that :func:`stale_reason` checks."""
    producer = producer or sys._getframe(1).f_globals["__name__"]
    if producer == __name__:  # a helper here computes nothing: name the analysis module
        raise ValueError("output_metadata called from analysis.common: pass producer=<computing module>")
    primary = sources[0][1]
    md = {k: primary[k] for k in REQUIRED_META}
    for k, v in primary.items():
        if k.startswith("subset"):
            md[k] = v
    md["table"] = table
    md["analysis_code_version"] = code_version_string()
    md |= code_stamp(producer)
    md["sources"] = [source_record(p, m) for p, m in sources]
    md["params"] = dict(params or {})
    if extra:
        md.update(extra)
    return md


def write_table(df: pd.DataFrame, out_dir: str | Path, name: str, meta: dict) -> dict[str, Path]:
    """Write ``<out_dir>/<name>.parquet`` (stamped) and ``<name>.csv``; return both paths."""
    out_dir = Path(out_dir)
    pq_path = write_parquet(df.reset_index(drop=True), out_dir / f"{name}.parquet", meta)
    csv_path = out_dir / f"{name}.csv"
    write_csv(df, csv_path)
    return {name: pq_path, f"{name}_csv": csv_path}


def write_tables(step: str, tables: dict[str, pd.DataFrame], out_dir: str | Path,
                 meta_for: Callable[[str], dict]) -> dict[str, Path]:
    """Write the already-computed tables of analysis step ``step`` (computing first, then
    writing, so a failing computation leaves no new file behind). They must be exactly the
    tables :data:`.outputs.TABLE_STEPS` lists for the step (what its rule declares); the
    paths returned are :func:`.outputs.table_outputs` of the step."""
    names = step_tables(step)
    if set(tables) != set(names):
        raise ValueError(f"analysis step {step!r} computed the tables {sorted(tables)}, but "
                         f"safetyrepro.analysis.outputs lists {list(names)} for it")
    paths: dict[str, Path] = {}
    for name in names:
        paths.update(write_table(tables[name], out_dir, name, meta_for(name)))
    assert paths == table_outputs(step, out_dir)
    return paths


def read_table(path: str | Path) -> tuple[pd.DataFrame, dict]:
    table, meta = read_parquet(path)
    return table.to_pandas(), meta


def stale_note(name: str, meta: dict) -> str | None:
    """A one-line STALE warning for a table (or card source) not computed by the current code,
    or None when it was: what a report or card prints next to it, so an old table never passes
    for a current one."""
    why = stale_reason(meta)
    return None if why is None else f"STALE: `{name}` is not from the current code ({why}); rerun the workflow"


def source_stale_note(path: str | Path, meta: dict) -> str | None:
    """:func:`stale_note` for a source table read by an output being written now; a source
    without a code stamp (from outside the pipeline) is not checked."""
    return stale_note(Path(path).name, meta) if meta.get("producer") else None


def weak_ranks(scores, tol: float | None = None) -> tuple[int, ...]:
    """Rank of each model (0 = best; models in a fixed order): the number of models strictly
    better, so tied models share a rank; the tie rule is :mod:`safetyrepro.metrics.compare`'s
    (pass :class:`~safetyrepro.metrics.compare.Scores` for exact comparisons)."""
    return _weak_ranks(scores, tol)


def check_rules_file(rules, path: Path, meta: dict) -> None:
    """The rules file used to classify configs must be the one the table was produced under."""
    if rules.stamp != meta.get("rules_stamp"):
        raise DataError(path, f"rules_stamp {meta.get('rules_stamp')} does not match the rules file "
                              f"{rules.path} (stamp {rules.stamp}); pass the rules the run used")


def version_text(cv) -> str:
    """A code-version record (dict from provenance.code_version, or a string) as one short line."""
    if isinstance(cv, dict):
        commit = cv.get("git_commit") or "nogit"
        src = str(cv.get("source_sha256") or "")[:12]
        return f"{cv.get('package_version', '?')}+{commit[:12]}{'-dirty' if commit.endswith('-dirty') else ''}" \
               + (f".src{src}" if src else "")
    return str(cv)


def pair_label(a: str, b: str) -> str:
    return f"{a} vs {b}"


def optional_source(path, cs, sources: list):
    """The table at ``path`` (None when no path is given), checked to come from the same rules
    as the cell scores ``cs``, and recorded in ``sources`` for the output's provenance."""
    if path is None:
        return None
    df, meta = read_table(path)
    check_same_rules((cs.path, cs.meta), (Path(path), meta))
    sources.append((Path(path), meta))
    return df

