"""Error types. Every user-facing failure is a SafetyReproError whose message names the
file, field, cell or item at fault; the CLI prints it and exits with status 2."""

from __future__ import annotations


class SafetyReproError(Exception):
    """Base class for errors caused by bad input or a failed run (not programming bugs). Its
    message is terminal-safe: names quoted from input files cannot carry escape sequences."""

    def __init__(self, *args):
        from .textsafe import terminal_safe  # deferred: html (~2 ms); most processes raise none

        super().__init__(*(terminal_safe(a, keep_newlines=True) if isinstance(a, str) else a for a in args))


class ConfigError(SafetyReproError):
    """A config or rules file is malformed: names the file and the field path."""

    def __init__(self, path, field: str | None, message: str):
        self.path = str(path)
        self.field = field
        where = f"{self.path}" + (f": field '{field}'" if field else "")
        super().__init__(f"{where}: {message}")


class DataError(SafetyReproError):
    """Benchmark or table data is missing or malformed: names the file (and row)."""

    def __init__(self, path, message: str, row=None):
        self.path = str(path)
        self.row = row
        where = self.path + (f", row {row}" if row is not None else "")
        super().__init__(f"{where}: {message}")


class ModelError(SafetyReproError):
    """A model could not be prepared or loaded."""


class CellError(SafetyReproError):
    """A cell failed while running (names the cell and, where relevant, the item)."""


class ShardError(SafetyReproError):
    """A result shard is missing, truncated, corrupt or inconsistent with its siblings."""


class WriteError(SafetyReproError, OSError):
    """An output file could not be written (disk full, permission denied, a folder in the way):
    names the file; nothing partial is left under its name. Also an OSError (with the
    original errno), so code that tolerates a failed write, such as a cache, still does."""

    def __init__(self, path, message: str, errno: int | None = None):
        self.path = str(path)
        super().__init__(f"{self.path}: cannot write: {message}")
        self.errno = errno
