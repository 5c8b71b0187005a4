"""``{kind: hub, id, revision}``: a Hugging Face hub repository at a pinned commit (40 hex
digits, required by the config schema). Prepared by downloading the snapshot with
``huggingface_hub.snapshot_download`` (its progress bars; token from ``HF_TOKEN`` or
``hf auth login``) into ``<resources>/models/hub/<org>--<name>@<revision[:12]>/``, checking
each LFS file's sha256 against the hub's record for that commit, and writing the
``PREPARED.json`` marker with the weights hash. Afterwards that folder is what loads, so the
cells never touch the network. An offline machine, a gated repository without access, an
unknown repository or revision fail here (:class:`~safetyrepro.errors.ModelError` naming the
model and what to do), before any cell runs."""

from __future__ import annotations

import time
from pathlib import Path

from ...errors import ModelError
from ...sysutil import atomic_write_json
from ...weights import MARKER, MARKER_FORMAT, file_sha256, library_versions, read_marker, weights_hash
from .progress import log

HUB_FILES = ["*.json", "*.safetensors", "tokenizer.model", "*.jinja", "*.txt", "*.tiktoken"]


def hub_dir(resources_dir: Path, source: dict) -> Path:
    return (Path(resources_dir) / "models" / "hub"
            / f"{source['id'].replace('/', '--')}@{source['revision'][:12]}")


def hub_prepared(folder: Path, source: dict) -> bool:
    """Whether ``folder`` holds a verified snapshot of this repository and revision."""
    m = read_marker(folder)
    return (bool(m) and m.get("format") == MARKER_FORMAT and m.get("source_kind") == "hub"
            and m.get("id") == source["id"] and m.get("revision") == source["revision"])


def hub_error(key: str, source: dict, exc: BaseException) -> ModelError:
    """A ModelError for a failed hub download that names the model and what to do."""
    from huggingface_hub import errors as hf  # deferred: heavy, and only a failed download needs it

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


def download_hub(resources_dir: Path, folder: Path, key: str, source: dict, *, progress: bool) -> None:
    """Download the pinned snapshot into ``folder`` and verify it (:func:`finish_hub_folder`)."""
    from huggingface_hub import HfApi, snapshot_download  # deferred: heavy, only a download needs it
    from huggingface_hub.utils import disable_progress_bars, enable_progress_bars  # deferred: heavy, download only

    log(progress, f"{key}: downloading {source['id']}@{source['revision']} into {folder}")
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


def finish_hub_folder(folder: Path, key: str, source: dict, expected_sha256: dict[str, str], *,
                      progress: bool = True) -> dict:
    """Verify a downloaded hub snapshot in ``folder`` and write its marker (last): every
    ``*.safetensors`` file must have the sha256 the hub records for it at the pinned revision
    (``expected_sha256``: file name -> digest; a file the hub did not list is an error too).
    The weights hash (:func:`~safetyrepro.weights.weights_hash`) is recorded with it."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelError(f"model {key} ({source['id']}@{source['revision']}): the snapshot in "
                         f"{folder} has no *.safetensors weights; this project loads safetensors only")
    for f in files:
        want = expected_sha256.get(f.name)
        if want is None:
            raise ModelError(f"model {key}: {f} is not listed with a sha256 by the hub for "
                             f"{source['id']}@{source['revision']}")
        log(progress, f"{key}: verifying {f.name}")
        got = file_sha256(f)
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
        "versions": library_versions(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    atomic_write_json(folder / MARKER, record, indent=2)
    return record
