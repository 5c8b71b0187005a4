"""Errors raised by the worker client. All are SafetyReproErrors (the CLI prints the message
and exits 2); those caused by a cell are also CellErrors, those caused by loading a model are
also ModelErrors."""

from __future__ import annotations

from ..errors import CellError, ModelError, SafetyReproError


class WorkerError(SafetyReproError):
    """The worker infrastructure failed (could not start, protocol mismatch, ...)."""


class WorkerStartError(WorkerError):
    """A worker process could not be started; the message quotes its log."""


class WorkerCrashed(WorkerError, CellError):
    """The worker died while running a request; a rerun starts a fresh worker."""


class WorkerLoadError(WorkerError, ModelError):
    """The worker's loader (e.g. model loading) raised; the worker exits after reporting it."""


class WorkerCallError(CellError):
    """The target raised inside the worker (the worker keeps serving unless ``fatal``).

    ``error_type`` is the remote exception's class name, ``remote_message`` its message,
    ``remote_traceback`` the formatted traceback from the worker."""

    def __init__(self, message: str, *, key: str, pid: int | None, target: str,
                 label: str | None, error_type: str, remote_message: str,
                 remote_traceback: str, fatal: bool = False):
        super().__init__(message)
        self.key = key
        self.pid = pid
        self.target = target
        self.label = label
        self.error_type = error_type
        self.remote_message = remote_message
        self.remote_traceback = remote_traceback
        self.fatal = fatal
