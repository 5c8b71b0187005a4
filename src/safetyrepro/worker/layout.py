"""Layout of a node's worker state directory: resource keys, file and socket paths, device
lock paths, and the checks every private folder and file of it passes.

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

Standard library only (imported by every cell client), as are the other state modules:
:mod:`.locks` (flocks), :mod:`.pidfiles` (pid files and worker processes), :mod:`.allocation`
(a Slurm job's workers), :mod:`.spec` (what a worker holds), :mod:`.logtail`.
"""

from __future__ import annotations

import errno
import hashlib
import os
import pwd
import re
import stat
from pathlib import Path

from ..sysutil import hostname
from .allocation import allocation_id
from .errors import WorkerError

WORKERS_SUBDIR = ".workers"
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
    return "run-h" + hashlib.sha256(str(run_id).encode("utf-8", "surrogatepass")).hexdigest()[:40]


def make_key(*parts: str) -> str:
    """Join parts (e.g. model key, quantization, short config hash) into a valid key."""
    cleaned = [re.sub(r"[^A-Za-z0-9._+-]", "_", str(p)) for p in parts if str(p)]
    return check_key(".".join(cleaned)[:120])


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
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
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
