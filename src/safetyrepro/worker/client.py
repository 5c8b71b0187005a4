"""The thin client a cell job uses: run one call in the node's worker for a resource key,
starting that worker if none is running.

Importing this module must stay cheap (every Snakemake cell job is a fresh Python process):
standard library and ``safetyrepro.errors`` only, no torch/numpy.

    result = run_in_worker(state_dir, "qwen2.5-0.5b.nf4.3f2a", "safetyrepro.cells:load_runner",
                           {"config_path": ..., "model": ..., "quantization": ...},
                           "safetyrepro.cells:run_cell_in_worker", {"request": {...}},
                           label="qwen2.5-0.5b/bbq/T1-greedy-k0-freeform/s0 (main, nf4)")
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path
TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (client start-up)
if TYPE_CHECKING:
    from typing import Any

from ..procs import pid_alive
from .allocation import allocation_owner
from .errors import WorkerCallError, WorkerCrashed, WorkerError, WorkerLoadError, WorkerStartError
from .layout import WorkerPaths, open_private
from .locks import FileLock
from .logtail import log_tail
from .pidfiles import is_worker_process, list_pid_files, read_pid_file, remove_if_owned
from .protocol import (PROTOCOL_VERSION, ConnectionClosed, ProtocolError, encode_message,
                       peer_credentials, recv_message, send_frame)
from .spec import spec_hash

DEFAULT_IDLE_TIMEOUT = 120.0
DEFAULT_START_TIMEOUT = 60.0
HELLO_TIMEOUT = 30.0
MAX_ATTEMPTS = 20
RUN_ENV = "SAFETYREPRO_RUN_ID"  # set by the workflow for its jobs: the run a call belongs to
WATCHDOG_GRACE_S = 30.0   # past a call's deadline, the client waits this long for the watchdog
EXIT_ALREADY_RUNNING = 3  # see server.serve


class _Connection:
    """One accepted connection: the worker's hello, then one request and its reply."""

    def __init__(self, sock: socket.socket, hello: dict[str, Any], paths: WorkerPaths):
        self.sock = sock
        self.hello = hello
        self.paths = paths

    @property
    def pid(self) -> int | None:
        return self.hello.get("pid")

    def request(self, frame: bytes, timeout: float | None = None) -> dict[str, Any]:
        """Send a request and wait for the reply (at most ``timeout`` s; socket.timeout after
        that); ConnectionClosed or OSError if the worker went away."""
        self.sock.settimeout(timeout)
        send_frame(self.sock, frame)
        return recv_message(self.sock)

    def close(self) -> None:
        self.sock.close()


def connect(paths: WorkerPaths, timeout: float = HELLO_TIMEOUT) -> _Connection | None:
    """Connect to the worker for ``paths.key``; None if no worker is listening."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(str(paths.sock))
    except (FileNotFoundError, ConnectionRefusedError, NotADirectoryError):
        sock.close()
        return None
    except socket.timeout:
        sock.close()
        raise WorkerError(f"the worker socket {paths.sock} for {paths.key} accepted no connection "
                          f"within {timeout:.0f} s; last lines of {paths.log}:\n{log_tail(paths.log)}")
    creds = peer_credentials(sock)
    if creds is not None and creds[1] != os.getuid():
        sock.close()              # never send a cell (paths, config) to another user's process
        raise WorkerError(f"{paths.sock} is served by pid {creds[0]} of uid {creds[1]}, not by "
                          f"a worker of yours (uid {os.getuid()}); refusing to talk to it: "
                          f"remove the socket, or set the worker state folder to one of your own")
    try:
        hello = recv_message(sock)
    except (ConnectionClosed, ConnectionError):
        sock.close()              # closed before greeting: it was going away, nothing was sent
        return None
    except socket.timeout:
        sock.close()
        raise WorkerError(f"the worker for {paths.key} ({paths.sock}) did not answer within "
                          f"{timeout:.0f} s; last lines of {paths.log}:\n{log_tail(paths.log)}")
    except ProtocolError as exc:
        sock.close()
        raise WorkerError(f"{paths.sock} is not a SafetyRepro worker socket: {exc}") from exc
    if hello.get("hello") != 1 or hello.get("protocol") != PROTOCOL_VERSION or hello.get("key") != paths.key:
        sock.close()
        raise WorkerError(f"{paths.sock} answered {hello!r}; expected a protocol "
                          f"{PROTOCOL_VERSION} worker for {paths.key} (stop it with "
                          f"`safetyrepro worker stop --state-dir {paths.state_dir} --all`)")
    return _Connection(sock, hello, paths)


def simple_request(paths: WorkerPaths, msg: dict[str, Any]) -> dict[str, Any] | None:
    """Send a status/shutdown request; None if no worker answered."""
    conn = connect(paths)
    if conn is None:
        return None
    try:
        return conn.request(encode_message(msg))
    except (ConnectionClosed, OSError):
        return None
    finally:
        conn.close()


def _worker_env(env: dict[str, str] | None) -> dict[str, str]:
    out = dict(os.environ if env is None else env)
    # The worker must import this very package, whatever the client's sys.path trick was.
    pkg_parent = str(Path(__file__).resolve().parents[2])
    parts = [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p]
    if pkg_parent not in parts:
        parts.insert(0, pkg_parent)
    out["PYTHONPATH"] = os.pathsep.join(parts)
    out["PYTHONUNBUFFERED"] = "1"
    return out


def _spawn(paths: WorkerPaths, loader: str, loader_args: dict[str, Any], *, idle_timeout: float,
           start_timeout: float, slots: int, env: dict[str, str] | None, python: str | None,
           device_wait: float | None = None) -> None:
    """Start a detached worker and wait until it listens (call with the start lock held)."""
    import subprocess  # deferred: most clients find a worker running (cell-job start-up)

    cmd = [python or sys.executable, "-m", "safetyrepro.worker", "serve",
           "--state-dir", str(paths.state_dir), "--key", paths.key, "--loader", loader,
           "--loader-arg", json.dumps(loader_args, sort_keys=True),
           "--idle-timeout", repr(float(idle_timeout)), "--slots", str(int(slots)), "--detach"]
    owner = allocation_owner()
    if owner is not None:         # in a cluster job: the worker ends with the job's process
        cmd += ["--owner", owner]
    if device_wait is not None:
        cmd += ["--device-wait", repr(float(device_wait))]
    with os.fdopen(open_private(paths.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "ab") as logf:
        logf.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} client pid {os.getpid()} starts "
                   f"a worker for {paths.key}\n".encode())
        logf.flush()
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                                env=_worker_env(env), start_new_session=True, close_fds=True)
    try:
        rc = proc.wait(timeout=start_timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise WorkerStartError(f"the worker for {paths.key} did not start listening within "
                               f"{start_timeout:.0f} s; last lines of {paths.log}:\n"
                               f"{log_tail(paths.log)}") from None
    if rc == EXIT_ALREADY_RUNNING:
        return                    # another worker holds the key: the caller connects to it
    if rc != 0:
        raise WorkerStartError(f"the worker for {paths.key} failed to start (exit status {rc}); "
                               f"last lines of {paths.log}:\n{log_tail(paths.log)}")


def _make_room(paths: WorkerPaths, max_workers: int) -> list[int]:
    """Ask workers for other keys to shut down so that at most ``max_workers - 1`` of them
    keep serving (the most idle go first). Removes pid files of dead workers. Returns the
    pids asked to stop. Does not wait: the new worker waits for the device lock."""
    candidates = []
    for info in list_pid_files(paths.state_dir):
        if info.get("key") == paths.key:
            continue
        if not info["alive"]:
            remove_if_owned(Path(info["path"]), info["pid"])
            continue
        try:
            other = WorkerPaths(paths.state_dir, info["key"])
        except ValueError:
            continue
        conn = connect(other)
        if conn is None:
            continue              # not listening: already on its way out
        if conn.hello.get("draining"):
            conn.close()
            continue
        candidates.append((-(conn.hello.get("idle_s") or 0.0), other, conn))
    candidates.sort(key=lambda c: c[0])
    excess = len(candidates) - (max_workers - 1)
    asked = []
    for i, (_, other, conn) in enumerate(candidates):
        try:
            if i < excess:
                conn.request(encode_message({"op": "shutdown",
                                             "reason": f"device needed for {paths.key}"}))
                asked.append(conn.pid)
        except (ConnectionClosed, OSError):
            pass
        finally:
            conn.close()
    return asked


def _find_or_start(paths: WorkerPaths, spec: str, loader: str, loader_args: dict[str, Any], *,
                   idle_timeout: float, start_timeout: float, max_workers: int,
                   env: dict[str, str] | None, python: str | None,
                   device_wait: float | None = None) -> _Connection:
    with FileLock(paths.start_lock):
        conn = connect(paths)
        if conn is not None:
            if conn.hello.get("spec") == spec and not conn.hello.get("draining"):
                return conn
            try:
                if conn.hello.get("spec") != spec:
                    # Same key, different state (loader arguments or code changed): replace it.
                    conn.request(encode_message({"op": "shutdown",
                                                 "reason": f"replaced by a worker for spec {spec}"}))
            except (ConnectionClosed, OSError):
                pass
            finally:
                conn.close()
        _make_room(paths, max_workers)
        _spawn(paths, loader, loader_args, idle_timeout=idle_timeout, start_timeout=start_timeout,
               slots=max_workers, env=env, python=python, device_wait=device_wait)
        conn = connect(paths)
        if conn is None:
            raise WorkerStartError(f"started a worker for {paths.key} but cannot connect to "
                                   f"{paths.sock}; last lines of {paths.log}:\n{log_tail(paths.log)}")
        return conn


def _kill_unresponsive(paths: WorkerPaths, pid: int | None) -> None:
    """SIGKILL a worker that let a call run past its deadline without answering (its
    watchdog is stuck too), then clean up after it."""
    import signal  # deferred: only a stuck worker needs it (cell-job start-up)

    if pid is not None and is_worker_process(pid, paths.key):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        end = time.monotonic() + 10.0
        while pid_alive(pid) and time.monotonic() < end:
            time.sleep(0.05)
    _cleanup_after_crash(paths, pid)


def _cleanup_after_crash(paths: WorkerPaths, pid: int | None) -> None:
    """Remove the dead worker's pid file and socket (under the start lock, so that no fresh
    worker is binding the same path meanwhile)."""
    lock = FileLock(paths.start_lock)
    if not lock.acquire(timeout=5.0):
        return
    try:
        info = read_pid_file(paths.pid)
        if info is not None and not pid_alive(info["pid"]):
            remove_if_owned(paths.pid, info["pid"])
        if paths.sock.exists():
            conn = connect(paths, timeout=2.0)
            if conn is None:
                paths.sock.unlink(missing_ok=True)
            else:
                conn.close()
    except WorkerError:
        pass
    finally:
        lock.release()


def _remote_error(reply: dict[str, Any], paths: WorkerPaths, pid: int | None, target: str,
                  label: str | None) -> Exception:
    etype = str(reply.get("error_type", "Error"))
    msg = str(reply.get("message", ""))
    tb = str(reply.get("traceback", "") or "")
    where = f"worker for {paths.key}, pid {pid}; log {paths.log}"
    if reply.get("phase") == "load":
        detail = "" if reply.get("safetyrepro_error") else f"\n{tb}"
        return WorkerLoadError(f"{msg} [{where}]{detail}".rstrip())
    what = label or target
    if reply.get("safetyrepro_error"):
        text = f"{msg} [{etype} raised in {where}]"
    else:
        text = f"{what}: {etype}: {msg} [{where}]\n{tb}".rstrip()
    if reply.get("fatal"):
        text += "\n(the worker exited after this error; the next call starts a fresh one)"
    return WorkerCallError(text, key=paths.key, pid=pid, target=target, label=label,
                           error_type=etype, remote_message=msg, remote_traceback=tb,
                           fatal=bool(reply.get("fatal")))


def run_in_worker(state_dir: str | os.PathLike, key: str, loader: str,
                  loader_args: dict[str, Any], target: str, kwargs: dict[str, Any] | None = None,
                  *, idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
                  start_timeout: float = DEFAULT_START_TIMEOUT, label: str | None = None,
                  max_workers: int = 1, env: dict[str, str] | None = None,
                  python: str | None = None, call_timeout: float | None = None,
                  device_wait: float | None = None) -> Any:
    """Run ``target(state, **kwargs)`` in this node's worker for ``key`` and return its
    (JSON) result. ``state`` is ``loader(**loader_args)``, loaded once per worker.

    Reuses a live worker for ``key`` (with the same loader and arguments), else starts one
    (detached; it exits after ``idle_timeout`` s without calls), first asking workers for
    other keys to shut down so that at most ``max_workers`` are alive. Raises
    WorkerCallError (a CellError) if the target raised, WorkerLoadError (a ModelError) if
    loading failed, WorkerCrashed if the worker died during the call, WorkerStartError if it
    could not be started. ``label`` names the call in events and errors (e.g. the cell id);
    ``env`` is the environment for a newly started worker (default: this process's).

    ``call_timeout``: the call's deadline in seconds. The worker's watchdog answers a call
    that runs past it with an error and exits (a stuck kernel or a deadlock cannot be
    interrupted in place); should the worker not answer even then, the client kills it
    :data:`WATCHDOG_GRACE_S` later. ``device_wait``: how long a newly started worker may wait
    for the device before it fails, naming the holder (default: no limit)."""
    paths = WorkerPaths(state_dir, key)
    paths.ensure_dir()
    if not isinstance(loader_args, dict):
        raise TypeError("loader_args must be a dict")
    spec = spec_hash(loader, loader_args)
    request = {"op": "call", "target": target, "kwargs": kwargs or {}, "label": label}
    if os.environ.get(RUN_ENV):
        request["run"] = os.environ[RUN_ENV]     # which run uses the worker (end-of-run cleanup)
    if call_timeout is not None:
        request["timeout_s"] = float(call_timeout)
    frame = encode_message(request)
    wait = None if call_timeout is None else float(call_timeout) + WATCHDOG_GRACE_S
    what = label or target
    stale_pid = None
    for attempt in range(MAX_ATTEMPTS):
        conn = connect(paths)
        if conn is not None and (conn.hello.get("spec") != spec or conn.hello.get("draining")):
            conn.close()
            conn = None
        if conn is None:
            conn = _find_or_start(paths, spec, loader, loader_args, idle_timeout=idle_timeout,
                                  start_timeout=start_timeout, max_workers=max_workers,
                                  env=env, python=python, device_wait=device_wait)
        pid = conn.pid
        try:
            reply = conn.request(frame, timeout=wait)
        except socket.timeout:
            conn.close()
            _kill_unresponsive(paths, pid)
            raise WorkerCallError(
                f"{what}: no answer within {call_timeout:.0f} s (the call's deadline) plus "
                f"{WATCHDOG_GRACE_S:.0f} s: the worker for {key} (pid {pid}) was killed; "
                f"rerunning starts a fresh one. Last lines of {paths.log}:\n{log_tail(paths.log)}",
                key=key, pid=pid, target=target, label=label, error_type="CallTimeout",
                remote_message="no answer", remote_traceback="", fatal=True) from None
        except ProtocolError as exc:
            if not isinstance(exc, ConnectionClosed):
                raise WorkerError(f"the worker for {key} (pid {pid}) sent a malformed reply to "
                                  f"{what}: {exc}") from exc
            crash = exc
        except OSError as exc:
            crash = exc
        else:
            crash = None
        finally:
            conn.close()
        if crash is not None:
            time.sleep(0.2)       # let the log catch up
            _cleanup_after_crash(paths, pid)
            raise WorkerCrashed(f"the worker for {key} (pid {pid}) died while running {what} "
                                f"({crash}); rerunning starts a fresh worker. Last lines of "
                                f"{paths.log}:\n{log_tail(paths.log)}") from None
        if reply.get("retry"):
            time.sleep(min(0.05 * (attempt + 1), 0.5))
            continue
        if reply.get("ok"):
            return reply.get("result")
        if reply.get("stale") and stale_pid is None and pid is not None:
            # The worker found it holds stale code or data for this call and is exiting:
            # retry once, on a fresh worker (after the stale one is gone).
            stale_pid = pid
            end = time.monotonic() + 60.0
            while pid_alive(pid) and time.monotonic() < end:
                time.sleep(0.05)
            continue
        err = _remote_error(reply, paths, pid, target, label)
        if reply.get("stale") and stale_pid is not None:
            err.args = (f"{err.args[0]}\n(a fresh worker, pid {pid}, found the same mismatch after "
                        f"the stale one, pid {stale_pid}, exited: the code, config, rules, task files "
                        "or model weights changed after the workflow planned this job; run the "
                        "workflow again)",)
        raise err
    raise WorkerError(f"gave up running {what} after {MAX_ATTEMPTS} attempts: the worker for "
                      f"{key} kept shutting down (another client is taking the device?)")


# ---- managing workers ---------------------------------------------------------------------
