"""``{kind: local, path}``: an HF model folder on disk, loaded in place (it must exist and hold
``*.safetensors`` weights). Its weights hash is computed once and recorded under
``<resources>/models/local/<digest of the path>/PREPARED.json`` with each file's size and
modification time (:func:`safetyrepro.weights.record_local`); a worker start reuses it while
those are unchanged."""

from __future__ import annotations

from pathlib import Path

from ...errors import ConfigError
from ...weights import record_local


def prepare_local(cfg, key: str, source: dict) -> Path:
    """The folder of a ``local`` source, checked and its weights recorded; ConfigError naming
    ``models.<key>.source.path`` when it does not exist."""
    path = cfg.resolve(source["path"])
    if not path.is_dir():
        raise ConfigError(cfg.path, f"models.{key}.source.path",
                          f"model {key}: folder {path} does not exist; copy the model's HF folder "
                          "(config.json, tokenizer files, *.safetensors) there or fix the path")
    record_local(cfg.resources_dir, key, path)
    return path
