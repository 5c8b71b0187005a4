"""Layout of a node's worker state directory, file locks and process checks.

One state directory per node (default ``<results_dir>/.workers/<hostname>/``) holds, per
resource key K::

    K.sock        the worker's Unix socket (or a hashed name under /tmp when the path is long)
    K.pid         JSON {pid, key, host, sock, spec, loader, started}: the worker serving K
    K.lock        flock held by the worker serving K (released when it starts draining)
    K.log         the worker's stdout/stderr, appended across restarts

and, shared by all keys::

    start.lock    flock serializing "find or start a worker" among clients on this node
    events.jsonl  load/call/exit events (see :mod:`safetyrepro.worker.events`)

and, per node and device, shared by every run of this user on the node (any results folder):
``/tmp/safetyrepro-<uid>/devices/device-<dev>.lock`` (:func:`device_lock_dir`), the flock
held by a worker while its state (model) is loaded; with N slots, ``device-<dev>.lock``,
``device-<dev>.1.lock``, ... The lock holder records its pid, key and state folder in it.

Standard library only (imported by every cell client).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import re
import stat
import time
from pathlib import Path
TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (client start-up)
if TYPE_CHECKING:
    from typing import Any

from ..procs import pid_alive
from ..sysutil import atomic_write_json, hostname
from .errors import WorkerError

WORKERS_SUBDIR = ".workers"
SOURCE_SUFFIXES = (".py", ".yaml", ".yml", ".json")  # provenance.SOURCE_SUFFIXES (stdlib-only here)
STATE_DIR_ENV = "SAFETYREPRO_WORKER_DIR"
EVENTS_FILE = "events.jsonl"
# sun_path is 108 bytes on Linux (104 on macOS) including the terminating NUL.
MAX_SOCKET_PATH = 100
_KEY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,119}\Z")   # \Z: no trailing newline


def state_root(results_dir: str | os.PathLike) -> Path:
    """``$SAFETYREPRO_WORKER_DIR`` if that is set, else ``<results_dir>/.workers``: the folder
    holding one state folder per node."""
    root = os.environ.get(STATE_DIR_ENV)
    return Path(root) if root else Path(results_dir) / WORKERS_SUBDIR


def allocation_id(env: dict[str, str] | None = None) -> str | None:
    """``slurm<jobid>`` inside a Slurm allocation (``SLURM_JOB_ID``; every step and every
    process of a job sees the same value), else None."""
    job = (os.environ if env is None else env).get("SLURM_JOB_ID", "")
    return f"slurm{job}" if job.isdigit() else None


def node_state_dir(root: str | os.PathLike, host: str | None = None,
                   allocation: str | None = "auto") -> Path:
    """``<root>/<host>``, or ``<root>/<host>.<allocation>`` inside a cluster allocation (see
    :func:`allocation_id`). The host level matters on clusters whose nodes share the results
    filesystem (workers, sockets and locks are per node), so a job resolves it where it runs;
    the allocation level keeps a worker inside the Slurm job that started it: it never serves,
    waits for or stops the workers of another job on the same node (each job has its own
    GPU), and the job can stop all of its own workers before it ends."""
    alloc = allocation_id() if allocation == "auto" else allocation
    name = host or hostname()
    return Path(root) / (f"{name}.{alloc}" if alloc else name)


def default_state_dir(results_dir: str | os.PathLike, host: str | None = None) -> Path:
    """This node's state folder for a results folder (:func:`state_root`/<host>)."""
    return node_state_dir(state_root(results_dir), host)


def check_key(key: str) -> str:
    """A resource key names files: letters, digits and ``._+-``, at most 120 characters."""
    if not isinstance(key, str) or not _KEY_RE.match(key):
        raise ValueError(f"invalid worker key {key!r}: use letters, digits and '._+-' "
                         "(starting with a letter or digit, at most 120 characters)")
    return key


def run_token(run_id: str) -> str:
    """A run id as a file-name-safe key: itself when it is a valid key, else ``run-h`` and a
    sha256 prefix of it (run ids of any length and characters name distinct lease files)."""
    if isinstance(run_id, str) and _KEY_RE.match(run_id):
        return run_id
    import hashlib

    return "run-h" + hashlib.sha256(str(run_id).encode("utf-8", "surrogatepass")).hexdigest()[:40]


def make_key(*parts: str) -> str:
    """Join parts (e.g. model key, quantization, short config hash) into a valid key."""
    cleaned = [re.sub(r"[^A-Za-z0-9._+-]", "_", str(p)) for p in parts if str(p)]
    return check_key(".".join(cleaned)[:120])


def installed_sources_stamp(package_dir: str | os.PathLike | None = None) -> str:
    """A cheap fingerprint of the installed ``safetyrepro`` sources (path, size and mtime of
    every .py file and of the package's data files: task .yaml, .json). A worker started
    before the code changed is replaced, so a shard is never computed by stale code under a
    new code version (the cell fingerprint check in :func:`safetyrepro.cells.run_cell` is
    the end-to-end guarantee)."""
    root = Path(package_dir) if package_dir is not None else Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    stack = [root]
    entries = []
    while stack:
        d = stack.pop()
        try:
            with os.scandir(d) as it:
                for e in it:
                    if e.is_dir(follow_symlinks=False) and e.name != "__pycache__":
                        stack.append(Path(e.path))
                    elif e.name.endswith(SOURCE_SUFFIXES):
                        st = e.stat()
                        entries.append(f"{e.path}:{st.st_size}:{st.st_mtime_ns}")
        except OSError:
            continue
    for line in sorted(entries):
        h.update(line.encode("utf-8", "surrogateescape"))
    return h.hexdigest()[:16]


def spec_hash(loader: str, loader_args: dict[str, Any], stamp: str | None = None) -> str:
    """Identity of the state a worker holds: what it loads, with which arguments, by which
    code (``stamp``, default :func:`installed_sources_stamp`)."""
    blob = json.dumps({"loader": loader, "loader_args": loader_args,
                       "code": stamp if stamp is not None else installed_sources_stamp()}, sort_keys=True,
                      separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


class WorkerPaths:
    """File names for one resource key in one state directory."""

    def __init__(self, state_dir: str | os.PathLike, key: str):
        self.state_dir = Path(state_dir).absolute()
        self.key = check_key(key)
        d = self.state_dir
        self.pid = d / f"{key}.pid"
        self.key_lock = d / f"{key}.lock"
        self.log = d / f"{key}.log"
        self.start_lock = d / "start.lock"
        self.events = d / EVENTS_FILE
        self.sock = socket_path(d, key)

    def device_lock(self, slot: int) -> Path:
        """The node-wide lock of a device slot (:func:`device_lock_dir`), shared by the
        workers of every run on this node, whatever their results folder."""
        name = device_id()
        return device_lock_dir() / (f"device-{name}.lock" if slot == 0 else f"device-{name}.{slot}.lock")

    def ensure_dir(self) -> None:
        private_dir(self.state_dir)


DEVICE_DIR_ENV = "SAFETYREPRO_DEVICE_LOCK_DIR"


def device_id() -> str:
    """The device a worker loads its model on, as a file-name part: the first GPU of the
    Slurm step or job (SLURM_STEP_GPUS, SLURM_JOB_GPUS: the node's own indices), else the
    first entry of CUDA_VISIBLE_DEVICES (the device "cuda" means; an index or a GPU UUID),
    else "0". Slurm's name comes first because a cluster that confines each job to its GPUs
    with device cgroups renumbers CUDA_VISIBLE_DEVICES from 0 in every job: two jobs on
    different GPUs of one node would then wait for one lock. On a CPU-only node every worker
    shares "0", so runs on one node never hold two models at once there either."""
    for var in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES"):
        visible = os.environ.get(var, "").split(",")[0].strip()
        if visible:
            break
    return re.sub(r"[^A-Za-z0-9._-]", "_", visible) or "0"


def device_lock_dir() -> Path:
    """The per-node, per-user folder of device locks: ``$SAFETYREPRO_DEVICE_LOCK_DIR`` if set,
    else ``/tmp/safetyrepro-<uid>/devices`` (on the node's own /tmp, whatever TMPDIR says,
    so two runs with different results folders or TMPDIRs find the same lock)."""
    root = os.environ.get(DEVICE_DIR_ENV)
    if root:
        return private_dir(root)
    return private_dir(short_socket_dir() / "devices")


def device_locks() -> list[Path]:
    """Every device lock file of this node's lock folder."""
    return sorted(device_lock_dir().glob("device-*.lock"))


def socket_path(state_dir: Path, key: str) -> Path:
    """``<state_dir>/<key>.sock``, or ``/tmp/safetyrepro-<uid>/<hash>.sock`` when that is too
    long for AF_UNIX. The hash covers the full intended path, so every process computes the
    same name; the worker records the one it uses in its pid file. The fallback is always
    under /tmp, never ``$TMPDIR``: clusters set TMPDIR per job (and per step), and every
    process of a job on a node must find the same socket."""
    wanted = Path(state_dir) / f"{key}.sock"
    if len(os.fsencode(str(wanted))) <= MAX_SOCKET_PATH:
        return wanted
    digest = hashlib.sha256(os.fsencode(str(wanted))).hexdigest()[:20]
    return short_socket_dir() / f"{digest}.sock"


SHORT_SOCKET_PARENT = "/tmp"


def short_socket_dir() -> Path:
    """``/tmp/safetyrepro-<uid>`` (the socket folder when a state folder's path is too long for
    AF_UNIX, and the parent of the device locks), created 0700. A predictable name in a
    shared folder, so it is checked by :func:`private_dir` without repairing its mode: a
    symlink, a non-folder, a folder of another user or one open to others is refused."""
    return private_dir(Path(SHORT_SOCKET_PARENT) / f"safetyrepro-{os.getuid()}",
                       what="short socket folder", repair_mode=False)


# ---- private files and folders ------------------------------------------------------------
#
# Whoever can connect to a worker's socket can ask it to run a cell (and read its files);
# whoever can write into its state folder can plant a link where a lock, log or pid file is
# opened. So the state folder (and the short socket folder under /tmp, a predictable name)
# must be a real folder owned by this user with mode 0700, and every file in it is opened
# without following symbolic links and created 0600.

def _owner(uid: int) -> str:
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def private_dir(path: str | os.PathLike, *, what: str = "worker state folder",
                repair_mode: bool = True) -> Path:
    """Create ``path`` (parents as needed) or check the existing one: a real folder (not a
    symbolic link) owned by this user. A mode other than 0700 is set to 0700
    (``repair_mode``), or refused (a folder under a shared parent such as /tmp, which someone
    could have used while it was open). WorkerError naming the path and its owner otherwise.
    The one check of every private folder (state folders, socket and device-lock folders)."""
    d = Path(path)
    d.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(d, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(d)
    fix = f"remove it, or set {STATE_DIR_ENV} to a folder of your own"
    if stat.S_ISLNK(st.st_mode):
        raise WorkerError(f"{what} {d} is a symbolic link (to {os.readlink(d)}), owned by "
                          f"{_owner(st.st_uid)}; refusing to use it: {fix}")
    if not stat.S_ISDIR(st.st_mode):
        raise WorkerError(f"{what} {d} exists and is not a folder; refusing to use it: remove it")
    if st.st_uid != os.getuid():
        raise WorkerError(f"{what} {d} is owned by {_owner(st.st_uid)}, not by "
                          f"{_owner(os.getuid())}; refusing to use it (someone else could plant "
                          f"files or links there): {fix}")
    if stat.S_IMODE(st.st_mode) != 0o700:
        if not repair_mode:
            raise WorkerError(f"{what} {d} has mode {stat.S_IMODE(st.st_mode):o} (expected 700: "
                              "others could have planted files or links there); refusing to use "
                              "it: remove it")
        os.chmod(d, 0o700)
    return d


def open_private(path: str | os.PathLike, flags: int) -> int:
    """``os.open`` a file of a state folder: never through a symbolic link, created 0600,
    and refused unless it is a regular file owned by this user (made 0600 if it was not)."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise WorkerError(f"{path} is a symbolic link; refusing to open it (remove it)") from exc
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
            raise WorkerError(f"{path} is not a regular file owned by {_owner(os.getuid())} "
                              f"(owner: {_owner(st.st_uid)}); refusing to use it")
        if stat.S_IMODE(st.st_mode) & 0o077:
            os.fchmod(fd, 0o600)
    except BaseException:
        os.close(fd)
        raise
    return fd


# ---- locks ------------------------------------------------------------------------------

class FileLock:
    """An exclusive ``flock`` on a file. Released when released, or when the process dies
    (the descriptor is close-on-exec, so child processes do not inherit it)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, timeout: float | None = None, poll: float = 0.05) -> bool:
        """Block until acquired (``timeout=None``), or give up after ``timeout`` seconds
        (``0`` = one try). Returns whether the lock is held."""
        if self._fd is not None:
            return True
        fd = open_private(self.path, os.O_RDWR | os.O_CREAT)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self._fd = fd
                return True
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    os.close(fd)
                    raise WorkerError(f"cannot lock {self.path}: {exc}; worker state needs a "
                                      f"filesystem with flock (set {STATE_DIR_ENV} to a local "
                                      "directory)") from exc
            if deadline is not None and time.monotonic() >= deadline:
                os.close(fd)
                return False
            time.sleep(poll)

    def write_holder(self, info: dict[str, Any]) -> None:
        """Record who holds the lock inside the lock file (for status and error messages)."""
        if self._fd is None:
            raise RuntimeError(f"{self.path}: lock not held")
        data = json.dumps(info, sort_keys=True).encode("utf-8")
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, data, 0)

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)

    def __enter__(self) -> "FileLock":
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def lock_is_held(path: str | os.PathLike) -> bool:
    """Whether some process holds the flock on ``path`` (tries it without waiting)."""
    probe = FileLock(path)
    if not Path(path).exists():
        return False
    if probe.acquire(timeout=0):
        probe.release()
        return False
    return True


def read_holder(path: str | os.PathLike) -> dict[str, Any] | None:
    try:
        text = Path(path).read_text(encoding="utf-8")
        return json.loads(text) if text.strip() else None
    except (OSError, ValueError):
        return None


# ---- pid files and processes --------------------------------------------------------------


def is_worker_process(pid: int, key: str | None = None) -> bool:
    """Whether ``pid`` is a live worker process (for ``key`` if given), not an unrelated
    process that reused a dead worker's pid. Without /proc, only liveness is checked."""
    if not pid_alive(pid):
        return False
    if not Path("/proc/self").exists():
        return True
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except FileNotFoundError:
        return False              # exited meanwhile
    except OSError:
        return True
    if not any(argv):
        # an exiting process has already released its memory, so its command line reads
        # empty while the pid still exists: it is still our worker until it is gone
        return pid_alive(pid)
    if b"safetyrepro.worker" not in argv and not any(a.endswith(b"safetyrepro") for a in argv):
        return False
    return key is None or key.encode() in argv


def process_start_time(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (field 22 of /proc/PID/stat), which
    tells a process from a later one that reused its pid; None if it does not exist."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


OWNER_ENV = "SAFETYREPRO_JOB_OWNER"


def claim_allocation_owner() -> bool:
    """Inside a Slurm job: make this process the owner of the job's workers on this node,
    unless a live process of the same job and node already is (its claim is inherited in
    ``$SAFETYREPRO_JOB_OWNER``). The first Snakemake process of a group job (the batch step's,
    which runs each cell as a job step of its own) claims it; its job steps and their cell
    clients inherit the claim, and a worker they start exits when the owner is gone. Returns
    whether this process claimed it (and so should stop the job's workers when it exits)."""
    job = os.environ.get("SLURM_JOB_ID", "")
    if not job.isdigit() or not Path("/proc/self").exists():
        return False
    if allocation_owner() is not None:
        return False
    start = process_start_time(os.getpid())
    if start is None:
        return False
    os.environ[OWNER_ENV] = f"{job}:{hostname()}:{os.getpid()}:{start}"
    return True


def allocation_owner() -> str | None:
    """``"PID:START"`` of this job's owner process on this node (see
    :func:`claim_allocation_owner`) if it is alive, else None (also outside Slurm jobs)."""
    job = os.environ.get("SLURM_JOB_ID", "")
    parts = os.environ.get(OWNER_ENV, "").split(":")
    if not job.isdigit() or len(parts) != 4 or parts[0] != job or parts[1] != hostname():
        return None
    owner = f"{parts[2]}:{parts[3]}"
    try:
        return owner if owner_alive(owner) else None
    except ValueError:
        return None


def owner_alive(owner: str) -> bool:
    """Whether the process ``"PID:START"`` (from :func:`allocation_owner`) still runs."""
    pid_s, _, start_s = owner.partition(":")
    pid = int(pid_s)
    return pid_alive(pid) and str(process_start_time(pid)) == start_s


def write_pid_file(path: Path, info: dict[str, Any]) -> None:
    """Write a worker's pid file, private (0600), atomically; a link planted at ``path`` is
    replaced, not followed."""
    atomic_write_json(path, info, mode=0o600)


def read_pid_file(path: Path) -> dict[str, Any] | None:
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(info, dict) or not isinstance(info.get("pid"), int):
        return None
    return info


def remove_if_owned(path: Path, pid: int) -> bool:
    """Remove the pid file ``path`` if it still names ``pid`` (a successor may own it now)."""
    info = read_pid_file(path)
    if info is not None and info.get("pid") == pid:
        try:
            path.unlink()
            return True
        except FileNotFoundError:
            return False
    return False


def list_pid_files(state_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """The pid files of a state dir, each as its JSON plus ``path`` and ``alive``."""
    out = []
    d = Path(state_dir)
    if not d.is_dir():
        return out
    for p in sorted(d.glob("*.pid")):
        info = read_pid_file(p)
        if info is None:
            continue
        info["path"] = str(p)
        info["alive"] = is_worker_process(info["pid"], info.get("key"))
        out.append(info)
    return out


def log_tail(path: str | os.PathLike, lines: int = 30, max_chars: int = 4000) -> str:
    """The last lines of a worker log, for error messages."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 64 * 1024))
            text = fh.read().decode("utf-8", errors="replace")
    except OSError:
        return f"(no log at {path})"
    tail = "\n".join(text.rstrip("\n").splitlines()[-lines:])
    if len(tail) > max_chars:
        tail = "..." + tail[-max_chars:]
    return tail or "(log is empty)"
