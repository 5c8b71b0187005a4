"""Small system helpers shared by the whole package: this node's name, atomic file writes,
installed package versions.

Standard library only (besides the package's own stdlib-only :mod:`.errors` and
:mod:`.procs`) and cheap to import: every cell job's client process imports it, so it avoids
``typing`` and ``tempfile`` at import time.

Atomic writes: the data goes to a temp file beside the target named
``.<name>.<host>.<pid>.<random>.tmp``, is fsynced, renamed into place, and the folder is
fsynced, so neither a killed writer nor a crashed node leaves a file that looks complete.
Temp files left by a dead writer are swept by the next write of the same file
(:func:`sweep_stale_tmp`). Any OSError is a :class:`~.errors.WriteError` naming the file; the
temp file is removed and an existing file under the target name is untouched.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from pathlib import Path

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (client start-up)
if TYPE_CHECKING:
    from typing import Any, BinaryIO, Callable

from .errors import WriteError
from .procs import pid_alive

STALE_TMP_S = 24 * 3600  # a temp file of another node older than this is left over
ABSENT = "absent"         # the version of a distribution that is not installed


def hostname() -> str:
    """This node's short name (up to the first dot), safe as a path component."""
    name = socket.gethostname().split(".")[0] or "localhost"
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


def package_version(dist: str) -> str:
    """The installed version of distribution ``dist``, or :data:`ABSENT`."""
    import importlib.metadata  # deferred: slow to import, and the cell client never asks

    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return ABSENT


def compile_bytecode(package_dir: str | os.PathLike | None = None) -> bool:
    """Write the bytecode (``__pycache__``) of every module of ``package_dir`` (default: this
    package) that lacks it or has it stale; True if every module compiled. Every cell job
    starts a Python process that imports about twenty of the package's modules; where Python
    writes no bytecode itself (``PYTHONDONTWRITEBYTECODE``, as on this project's CI machines)
    each job compiled them again, about 12 of its 54 ms (benchmarks/RESULTS.md section 22).
    Only a speed-up: a folder it cannot write is left as it is (False)."""
    import compileall  # deferred: only the workflow's start calls this

    root = Path(package_dir) if package_dir is not None else Path(__file__).resolve().parent
    try:
        return bool(compileall.compile_dir(str(root), quiet=2))
    except OSError:
        return False


def _umask() -> int:
    """The process umask (read from /proc, else set and restored)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


def sweep_stale_tmp(path: str | os.PathLike) -> list[Path]:
    """Remove temp files of ``path`` left by a writer that died mid-write (killed worker,
    crashed node): those of a dead process on this node, and those of another node older than
    :data:`STALE_TMP_S`. Returns what was removed."""
    path = Path(path)
    host, removed = hostname(), []
    for tmp in path.parent.glob(f".{path.name}.*.tmp"):
        parts = tmp.name[len(path.name) + 2:].split(".")
        try:
            if len(parts) >= 4 and parts[0] == host:
                pid = int(parts[1])
                if pid == os.getpid() or pid_alive(pid):
                    continue               # ours, or its writer has not finished exiting
            elif time.time() - tmp.stat().st_mtime < STALE_TMP_S:
                continue
            tmp.unlink()
            removed.append(tmp)
        except (OSError, ValueError):
            continue
    return removed


def _fsync_dir(folder: Path) -> None:
    """Make a rename in ``folder`` durable (a crash after it cannot bring the old name back)."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _create_temp(path: Path) -> tuple[int, str]:
    """Create ``.<name>.<host>.<pid>.<random>.tmp`` beside ``path`` exclusively (mode 0600,
    never through a link), the name :func:`sweep_stale_tmp` reads."""
    prefix = f".{path.name}.{hostname()}.{os.getpid()}."
    while True:
        tmp = str(path.parent / f"{prefix}{os.urandom(6).hex()}.tmp")
        try:
            return os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                           0o600), tmp
        except FileExistsError:
            continue


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], object], *,
                 mode: int | None = None) -> Path:
    """Call ``write(fh)`` on a binary temp file and move it to ``path`` atomically (see the
    module doc); an exception from ``write`` leaves nothing under ``path``. ``mode``: the
    file's permission bits; default 0666 minus the umask, like any file the user creates (0600
    for a private file). A symbolic link at ``path`` is replaced, not followed."""
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        sweep_stale_tmp(path)
        fd, tmp = _create_temp(path)
        os.fchmod(fd, (0o666 & ~_umask()) if mode is None else mode)
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())      # the data is on disk before the name says "done"
        os.replace(tmp, path)
        tmp = None
        _fsync_dir(path.parent)
    except OSError as exc:
        if isinstance(exc, WriteError):
            raise
        raise WriteError(path, exc.strerror or str(exc), exc.errno) from exc
    finally:
        if tmp is not None and os.path.lexists(tmp):
            try:
                os.unlink(tmp)
            except OSError:
                pass
    return path


def atomic_write_bytes(path: str | os.PathLike, data, *, mode: int | None = None) -> Path:
    """:func:`atomic_write` of ``data`` (bytes-like)."""
    return atomic_write(path, lambda fh: fh.write(data), mode=mode)


def atomic_write_text(path: str | os.PathLike, text: str, *, mode: int | None = None) -> Path:
    """:func:`atomic_write_bytes` of ``text`` as UTF-8."""
    return atomic_write_bytes(path, text.encode("utf-8"), mode=mode)


def atomic_write_json(path: str | os.PathLike, obj: Any, *, indent: int | None = None,
                      mode: int | None = None) -> Path:
    """:func:`atomic_write_text` of ``obj`` as JSON with sorted keys and a final newline."""
    return atomic_write_text(path, json.dumps(obj, indent=indent, sort_keys=True) + "\n", mode=mode)
