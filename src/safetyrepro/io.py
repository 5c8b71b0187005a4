"""Parquet I/O with provenance metadata, written atomically.

Every table this project writes carries a JSON metadata record under the Parquet key
``safetyrepro`` (rules stamp, subset hash, code version, ...). Files are written to a temp
file in the same directory and renamed into place, so a crash never leaves a file that looks
complete."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from .errors import ShardError

META_KEY = b"safetyrepro"


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


# A spreadsheet reads a cell starting with one of these as a formula (CSV/formula injection:
# a model or benchmark named "=HYPERLINK(...)" in an input table would run when the CSV is
# opened). Text cells starting with them are written with a leading apostrophe, which
# spreadsheets show as text; numbers (a negative score) are not text and stay as they are.
FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_safe(df):
    """A copy of a pandas frame whose text cells cannot start a spreadsheet formula."""
    out = df.copy()
    for col in out.columns:
        if out[col].dtype == object or str(out[col].dtype) in ("string", "str"):
            out[col] = out[col].map(lambda v: "'" + v if isinstance(v, str) and v.startswith(FORMULA_PREFIXES)
                                    else v)
    out.columns = [("'" + c) if isinstance(c, str) and c.startswith(FORMULA_PREFIXES) else c
                   for c in out.columns]
    return out


def write_csv(df, path: str | Path) -> Path:
    """Write a pandas frame as CSV atomically, neutralising formula-like text (see above)."""
    atomic_write_text(path, spreadsheet_safe(df).to_csv(index=False))
    return Path(path)


def _to_arrow(table) -> pa.Table:
    if isinstance(table, pa.Table):
        return table
    if hasattr(table, "to_arrow"):  # polars
        return table.to_arrow()
    return pa.Table.from_pandas(table, preserve_index=False)  # pandas


def write_parquet(table, path: str | Path, metadata: dict[str, Any]) -> Path:
    """Write ``table`` (pyarrow / polars / pandas) to ``path`` atomically with ``metadata``."""
    path = Path(path)
    at = _to_arrow(table)
    existing = dict(at.schema.metadata or {})
    existing.pop(b"pandas", None)
    existing[META_KEY] = json.dumps(metadata, sort_keys=True, default=str).encode()
    at = at.replace_schema_metadata(existing)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        pq.write_table(at, tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def read_metadata(path: str | Path) -> dict[str, Any]:
    """The ``safetyrepro`` metadata of a Parquet file; ShardError if missing or unreadable."""
    path = Path(path)
    if not path.exists():
        raise ShardError(f"{path}: file not found")
    try:
        md = pq.read_schema(path).metadata or {}
    except Exception as exc:  # pyarrow raises several types for truncated files
        raise ShardError(f"{path}: not a readable Parquet file ({exc})") from exc
    if META_KEY not in md:
        raise ShardError(f"{path}: no safetyrepro metadata (not written by this pipeline?)")
    return json.loads(md[META_KEY])


def read_parquet(path: str | Path) -> tuple[pa.Table, dict[str, Any]]:
    """Read a table and its metadata, turning any corruption into a ShardError naming it."""
    meta = read_metadata(path)
    try:
        table = pq.read_table(path)
    except Exception as exc:
        raise ShardError(f"{path}: corrupt Parquet data ({exc})") from exc
    return table, meta
