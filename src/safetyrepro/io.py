"""Parquet and CSV I/O with provenance metadata, written atomically.

Every table this project writes carries a JSON metadata record under the Parquet key
``safetyrepro`` (rules stamp, subset hash, code version, ...). Files are written with
:func:`.sysutil.atomic_write_bytes` (temp file, fsync, rename; a WriteError naming the file
on failure) and get the user's umask."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from .errors import ShardError
from .sysutil import atomic_write_bytes, atomic_write_text

META_KEY = b"safetyrepro"
DIGEST_KEY = b"safetyrepro_digest"    # sha256 of the data (table_digest), beside the metadata
CORRUPT_SUFFIX = ".corrupt"


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


def table_digest(table: pa.Table) -> str:
    """sha256 of a table's data and its safetyrepro metadata: the columns (schema without
    metadata, one record batch) as Arrow IPC stream bytes, then the metadata JSON. Computed at
    write time from the table as Parquet gives it back, so the reader, decoding the same pages,
    gets the same bytes."""
    h = hashlib.sha256((table.schema.metadata or {}).get(META_KEY, b""))
    t = table.replace_schema_metadata(None).combine_chunks()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, t.schema) as w:
        for batch in t.to_batches():
            w.write_batch(batch)
    h.update(sink.getvalue())
    return h.hexdigest()


def _parquet_bytes(at: pa.Table) -> pa.Buffer:
    sink = pa.BufferOutputStream()
    pq.write_table(at, sink, write_page_checksum=True)
    return sink.getvalue()


def write_parquet(table, path: str | Path, metadata: dict[str, Any]) -> Path:
    """Write ``table`` (pyarrow / polars / pandas) to ``path`` atomically with ``metadata``,
    page checksums and the content digest (see the module doc)."""
    path = Path(path)
    at = _to_arrow(table)
    existing = dict(at.schema.metadata or {})
    existing.pop(b"pandas", None)
    existing.pop(DIGEST_KEY, None)
    existing[META_KEY] = json.dumps(metadata, sort_keys=True, default=str).encode()
    at = at.replace_schema_metadata(existing)
    # the digest of what a reader will decode: this table through a Parquet round trip
    back = pq.read_table(pa.BufferReader(_parquet_bytes(at)))
    at = at.replace_schema_metadata({**existing, DIGEST_KEY: table_digest(back).encode()})
    data = _parquet_bytes(at)
    atomic_write_bytes(path, memoryview(data))
    return path


def quarantine(path: Path, why: str) -> ShardError:
    """Move a corrupt file out of its name (to ``<name>.corrupt``) so a rerun recomputes it;
    the error to raise says what happened (and where the file went)."""
    dest = path.with_name(path.name + CORRUPT_SUFFIX)
    try:
        os.replace(path, dest)
        moved = f"; moved to {dest.name} so that the next run recomputes it"
    except OSError as exc:
        moved = f"; could not move it aside ({exc.strerror}): delete it and rerun"
    return ShardError(f"{path}: {why}{moved}")


def _unreadable(path: Path, why: str, exc: Exception) -> ShardError:
    """A failed read: the system's (permission, I/O error: the file may be fine, it stays)
    or the file's (corrupt: moved aside)."""
    if isinstance(exc, OSError) and exc.errno is not None:
        return ShardError(f"{path}: cannot read: {exc.strerror or exc}")
    return quarantine(path, why)


def _parse_meta(path: Path, raw: bytes) -> dict[str, Any]:
    try:
        meta = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise quarantine(path, f"its safetyrepro metadata is not valid JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise quarantine(path, f"its safetyrepro metadata is a {type(meta).__name__}, not a JSON object")
    return meta


def read_metadata(path: str | Path) -> dict[str, Any]:
    """The ``safetyrepro`` metadata of a Parquet file; ShardError if missing or unreadable."""
    path = Path(path)
    try:
        st = path.stat()
    except (FileNotFoundError, NotADirectoryError):
        raise ShardError(f"{path}: file not found") from None
    except OSError as exc:
        raise ShardError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ShardError(f"{path}: not a file")
    try:
        md = pq.read_schema(path).metadata or {}
    except Exception as exc:  # pyarrow raises several types for truncated files
        raise _unreadable(path, f"not a readable Parquet file ({exc})", exc) from exc
    if META_KEY not in md:
        raise ShardError(f"{path}: no safetyrepro metadata (not written by this pipeline?)")
    return _parse_meta(path, md[META_KEY])


def read_parquet(path: str | Path) -> tuple[pa.Table, dict[str, Any]]:
    """Read a table and its metadata, verifying page checksums and the content digest; any
    corruption is a ShardError naming the file, which is moved aside (:func:`quarantine`)."""
    path = Path(path)
    meta = read_metadata(path)
    try:
        table = pq.read_table(path, page_checksum_verification=True)
    except Exception as exc:
        raise _unreadable(path, f"corrupt Parquet data ({exc})", exc) from exc
    md = table.schema.metadata or {}
    want = md.get(DIGEST_KEY)
    if want is not None and table_digest(table).encode() != want:
        raise quarantine(path, "corrupt data: the content digest does not match the one written")
    return table, meta
