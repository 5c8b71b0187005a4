"""Models: preparation (download / verify / convert, :mod:`.prepare` over :mod:`.sources`),
loading with a quantisation on a device (:mod:`.load`) and chat formatting (:mod:`.chat`).

Names are imported lazily so that the CLI (which registers the model commands) starts
without torch or transformers."""

import importlib

_EXPORTS = {
    "format_prompt": "chat", "format_prompt_parts": "chat",
    "LoadedModel": "load", "load_model": "load",
    "prepare_model": "prepare",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
