"""Persistent per-model worker processes ("NF4 GPU worker").

Each cell job is a thin client (:func:`run_in_worker`) of a worker process that holds one
loaded model and runs cells on it; see :mod:`.server` for the worker's behaviour,
:mod:`.protocol` for the wire format, :mod:`.state` for the per-node state directory and
:mod:`.events` for the load/call log and its summary.

This package's ``__init__`` imports only the light client side (no torch).
"""

from .client import run_in_worker, stop_workers, worker_status
from .errors import (WorkerCallError, WorkerCrashed, WorkerError, WorkerLoadError,
                     WorkerStartError)
from .events import event_files, format_summary, summarize_events
from .state import default_state_dir, make_key

__all__ = ["run_in_worker", "stop_workers", "worker_status", "WorkerCallError", "WorkerCrashed",
           "WorkerError", "WorkerLoadError", "WorkerStartError", "event_files", "format_summary",
           "summarize_events", "default_state_dir", "make_key"]
