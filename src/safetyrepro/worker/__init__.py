"""Persistent per-model worker processes ("NF4 GPU worker").

Each cell job is a thin client (:func:`run_in_worker`) of a worker process that holds one
loaded model and runs cells on it; see :mod:`.server` for the worker's behaviour,
:mod:`.protocol` for the wire format, :mod:`.layout` (and :mod:`.locks`, :mod:`.pidfiles`, :mod:`.allocation`, :mod:`.spec`) for the per-node state directory and
:mod:`.events` for the load/call log and its summary.

This package's ``__init__`` imports only the light client side (no torch).
"""

from importlib import import_module as _import_module

# Resolved on first use (PEP 562): a cell job's client imports ``.client`` alone, and every
# module it does not need costs start-up time on each of the run's ~1,800 jobs.
_EXPORTS = {
    "run_in_worker": "client", "stop_workers": "lifecycle", "worker_status": "lifecycle",
    "WorkerCallError": "errors", "WorkerCrashed": "errors", "WorkerError": "errors",
    "WorkerLoadError": "errors", "WorkerStartError": "errors",
    "event_files": "events", "format_summary": "events", "summarize_events": "events",
    "default_state_dir": "layout", "make_key": "layout",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value
