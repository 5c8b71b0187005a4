"""What a worker may run and how it answers: the allowed loader and call targets (anything
else named over the socket is refused), resolving ``module:function``, which exceptions end
the worker, and the error and retry replies a client receives."""

from __future__ import annotations

import importlib
import os
import traceback
from typing import Any, Callable

from ..errors import SafetyReproError

# frames of these files are the worker's own, left off the top of a call's traceback
_OWN_FILES = frozenset({__file__, os.path.join(os.path.dirname(__file__), "server.py")})


# What a worker may be asked to run: its loader (from its command line) and the cell call
# (from a client over the socket). Nothing else is importable through the socket: a frame
# naming another ``module:function`` is refused. Tests add their own target modules through
# TEST_TARGETS_ENV (a comma-separated list of module names), set only in the environment of
# the workers they start.
ALLOWED_LOADERS = frozenset({"safetyrepro.cells:load_runner"})
ALLOWED_TARGETS = frozenset({"safetyrepro.cells:run_cell_in_worker"})
TEST_TARGETS_ENV = "SAFETYREPRO_WORKER_TEST_TARGETS"


def test_target_modules() -> frozenset[str]:
    raw = os.environ.get(TEST_TARGETS_ENV, "")
    return frozenset(m.strip() for m in raw.split(",") if m.strip())


def is_allowed(spec: str, allowed: frozenset[str], test_modules: frozenset[str]) -> bool:
    """Whether ``module:function`` is one of ``allowed``, or a function of a test module."""
    module, sep, attr = str(spec).partition(":")
    return spec in allowed or (bool(sep) and module in test_modules and "." not in attr
                               and not attr.startswith("_"))


def resolve_callable(spec: str) -> Callable[..., Any]:
    """Import ``"package.module:function"`` (the attribute may be dotted)."""
    module_name, sep, attr = str(spec).partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{spec!r} is not of the form 'module:function'")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"{spec!r} is not callable")
    return obj


def is_fatal(exc: BaseException) -> bool:
    """Whether an exception from a call leaves the worker unusable (it then exits)."""
    if not isinstance(exc, Exception):
        return True
    if getattr(exc, "worker_fatal", False):
        return True
    text = f"{type(exc).__name__}: {exc}"
    return ("AcceleratorError" in text or "CUDA error" in text
            or "device-side assert" in text or "CUBLAS_STATUS" in text)


def format_remote(exc: BaseException) -> str:
    """The traceback without the worker's own frame(s) (this module, the server) on top."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename in _OWN_FILES and tb.tb_next is not None:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def error_reply(exc: BaseException, phase: str, *, fatal: bool = False, retry: bool = False,
                message: str | None = None) -> dict[str, Any]:
    return {"ok": False, "phase": phase, "error_type": type(exc).__name__,
            "safetyrepro_error": isinstance(exc, SafetyReproError),
            "message": message if message is not None else str(exc),
            "traceback": format_remote(exc),
            "fatal": fatal, "retry": retry,
            # the worker's loaded code/data is stale for this call (it exits; a fresh one retries)
            "stale": bool(getattr(exc, "worker_stale", False))}


def retry_reply(reason: str) -> dict[str, Any]:
    return {"ok": False, "phase": "call", "error_type": "WorkerShuttingDown",
            "safetyrepro_error": False, "message": f"worker is shutting down ({reason})",
            "traceback": "", "fatal": False, "retry": True}
