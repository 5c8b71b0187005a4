"""The persistent worker process: holds one resource (e.g. a loaded model) and runs calls on it.

A worker serves one resource key. At start it binds its socket, then takes a device slot
(``device.lock``; waits while another worker holds it), calls its *loader* once
(``loader(**loader_args)`` returns the state, e.g. the model) and then runs call requests,
one at a time in arrival order, as ``target(state, **kwargs)`` in its main thread.

* A call that raises an ``Exception`` is answered with the error and the worker keeps
  serving; a ``BaseException`` (KeyboardInterrupt, SystemExit), an exception whose class or
  instance has ``worker_fatal = True``, or a CUDA error ends the worker after answering.
* A loader failure is answered to every waiting and later client; the worker then exits.
* Shutdown (a ``shutdown`` request, SIGTERM, the idle timeout or a fatal error) *drains*: the
  socket is removed and the key lock released at once (a successor for the same key may
  start and wait for the device), calls already queued still run, and the process exits;
  the device lock goes with the process. Queued calls are answered ``retry`` instead (their
  clients start a fresh worker) when the worker has not loaded yet or the error was fatal.
* Queued calls whose client has gone away (killed job) are skipped.
* A worker with an *owner* (``"PID:START"``, the process that bounds a cluster job's use of
  it; see :func:`state.allocation_owner`) exits when that process is gone: at once if idle,
  after :data:`OWNER_GRACE_S` if a call is still running (its client went with the job).

What a worker may run and its replies: :mod:`.calls`; the device slot: :mod:`.device_slot`.
"""

from __future__ import annotations

import collections
import gc
import logging
import os
import select
import signal
import socket
import sys
import threading
import time
import traceback
from typing import Any, Callable

from ..sysutil import hostname
from .allocation import allocation_id, owner_alive
from .calls import (ALLOWED_LOADERS, ALLOWED_TARGETS, error_reply, is_allowed, is_fatal, resolve_callable,
                    retry_reply, test_target_modules)
from .device_slot import DeviceSlot
from .errors import WorkerError
from .events import append_event
from .layout import WorkerPaths, open_private, run_token
from .locks import FileLock, read_holder
from .pidfiles import remove_if_owned, write_pid_file
from .protocol import (MAX_REQUEST_BYTES, PROTOCOL_VERSION, MessageTooLarge, ProtocolError, encode_message,
                       peer_credentials, recv_message, send_frame, send_message)
from .spec import spec_hash

log = logging.getLogger("safetyrepro.worker")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_ALREADY_RUNNING = 3
REQUEST_READ_TIMEOUT = 60.0
# Limits on what a client can hold: its hello-to-request exchange must be complete within
# REQUEST_DEADLINE_S (a per-recv timeout alone let a byte every few seconds keep a connection,
# and so a draining worker, alive for ever); at most MAX_CONNECTIONS are read at once (more
# are closed at accept); a request is at most MAX_REQUEST_BYTES (protocol); a reply must be
# taken within REPLY_SEND_TIMEOUT_S; a draining worker waits at most DRAIN_DEADLINE_S for
# connections still being read.
# (SAFETYREPRO_WORKER_<NAME> in the worker's environment overrides one, e.g. for tests.)


def _limit(name: str, default: float) -> float:
    try:
        v = float(os.environ.get(f"SAFETYREPRO_WORKER_{name}", default))
    except ValueError:
        return default
    return v if 0 < v < 1e9 else default


REQUEST_DEADLINE_S = _limit("REQUEST_DEADLINE_S", 60.0)
MAX_CONNECTIONS = int(_limit("MAX_CONNECTIONS", 64))
REPLY_SEND_TIMEOUT_S = _limit("REPLY_SEND_TIMEOUT_S", 60.0)
DRAIN_DEADLINE_S = REQUEST_DEADLINE_S + 5.0
OWNER_POLL_S = 0.5
OWNER_GRACE_S = 2.0
WATCHDOG_POLL_S = 0.2


def _client_gone(conn: socket.socket) -> bool:
    """Whether the client closed its end (it sends nothing after its request)."""
    try:
        readable, _, _ = select.select([conn], [], [], 0)
        if not readable:
            return False
        return conn.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def _free_accelerator_cache() -> None:
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                torch.cuda.empty_cache()
        except Exception:  # noqa: BLE001 - best effort after a failed call
            pass


class _Job:
    __slots__ = ("conn", "request", "target", "label", "queued_at")

    def __init__(self, conn: socket.socket, request: dict[str, Any]):
        self.conn = conn
        self.request = request
        self.target = request["target"]
        self.label = request.get("label")
        self.queued_at = time.time()


class Worker:
    """One worker process's server. Use :func:`serve` to run one."""

    def __init__(self, paths: WorkerPaths, key_lock: FileLock, loader: str,
                 loader_args: dict[str, Any], idle_timeout: float, slots: int = 1,
                 owner: str | None = None, device_wait: float | None = None):
        if not isinstance(loader_args, dict):
            raise ValueError(f"loader args must be a JSON object, got {type(loader_args).__name__}")
        if idle_timeout <= 0:
            raise ValueError(f"idle timeout must be positive, got {idle_timeout}")
        if slots < 1:
            raise ValueError(f"device slots must be >= 1, got {slots}")
        self.paths = paths
        self.key = paths.key
        self.loader = loader
        self.loader_args = loader_args
        self.idle_timeout = float(idle_timeout)
        self.slots = int(slots)
        if owner is not None and not owner_alive(owner):
            raise ValueError(f"owner process {owner} is not running")
        self.owner = owner
        self.allocation = allocation_id()
        if device_wait is not None and device_wait <= 0:
            raise ValueError(f"device wait must be positive, got {device_wait}")
        self.device_wait = device_wait
        self._deadline: float | None = None   # monotonic deadline of the current call
        self.test_modules = test_target_modules()
        if not is_allowed(loader, ALLOWED_LOADERS, self.test_modules):
            raise ValueError(f"loader {loader!r} is not a worker loader (allowed: "
                             f"{sorted(ALLOWED_LOADERS)})")
        self.spec = spec_hash(loader, loader_args)
        self.pid = os.getpid()
        self.host = hostname()
        self._key_lock = key_lock
        self._device = self._device_slot()
        self._cond = threading.Condition(threading.Lock())
        self._queue: collections.deque[_Job] = collections.deque()
        self._draining = False
        self._drain_reason: str | None = None
        self._drain_started: float | None = None   # monotonic
        self._phase = "starting"
        self._load_error: dict[str, Any] | None = None
        self._load_seconds: float | None = None
        self._state: Any = None
        self._current: _Job | None = None
        self._n_calls = 0
        self._in_flight = 0          # handler threads between accept and hand-off
        self._started = time.time()
        self._last_activity = time.monotonic()
        self._listener: socket.socket | None = None
        self._runs: dict[str, float] = {}   # run id -> when its last call came (see RUN_ENV)
        self._acceptor: threading.Thread | None = None

    # ---- bookkeeping ------------------------------------------------------------------
    def _device_slot(self) -> DeviceSlot:
        return DeviceSlot(self.paths, self.slots, {"pid": self.pid, "key": self.key, "host": self.host},
                          self.device_wait, self._event)

    def _event(self, event: str, **fields: Any) -> None:
        rec = {"event": event, "key": self.key, "pid": self.pid, "host": self.host,
               "t": time.time(), **fields}
        if self.allocation:
            rec["allocation"] = self.allocation
        try:
            append_event(self.paths.events, rec)
        except (OSError, WorkerError) as exc:
            log.warning("cannot append to %s: %s", self.paths.events, exc)

    def _hello(self) -> dict[str, Any]:
        with self._cond:
            return {"hello": 1, "protocol": PROTOCOL_VERSION, "pid": self.pid, "key": self.key,
                    "host": self.host, "spec": self.spec, "phase": self._phase,
                    "draining": self._draining, "busy": self._current is not None,
                    "queued": len(self._queue),
                    "idle_s": round(time.monotonic() - self._last_activity, 3)}

    def status(self) -> dict[str, Any]:
        st = self._hello()
        with self._cond:
            st.update({"loader": self.loader, "drain_reason": self._drain_reason,
                       "n_calls": self._n_calls, "uptime_s": round(time.time() - self._started, 3),
                       "runs": dict(self._runs),
                       "load_seconds": self._load_seconds, "device_slot": self._device.slot,
                       "current": (self._current.label or self._current.target)
                       if self._current else None,
                       "idle_timeout": self.idle_timeout, "sock": str(self.paths.sock)})
        return st

    # ---- draining ---------------------------------------------------------------------
    def _start_drain_locked(self, reason: str) -> None:
        if self._draining:
            return
        self._draining = True
        self._drain_reason = reason
        self._drain_started = time.monotonic()
        log.info("shutting down (%s); %d call(s) queued", reason, len(self._queue))
        # Stop being findable, and let a successor for this key start (it will wait for
        # the device). We still hold the key lock, so the socket path is ours to remove.
        try:
            if self._listener is not None:
                os.unlink(self.paths.sock)
        except FileNotFoundError:
            pass
        self._key_lock.release()
        self._cond.notify_all()

    def request_drain(self, reason: str) -> None:
        with self._cond:
            self._start_drain_locked(reason)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        # Signal handlers run in the main thread, possibly while it holds self._cond:
        # hand the work to a thread instead of taking the lock here.
        threading.Thread(target=self.request_drain, args=(f"signal {signum}",),
                         name="sigterm", daemon=True).start()

    # ---- socket side ------------------------------------------------------------------
    def _bind(self) -> None:
        path = self.paths.sock
        try:
            os.unlink(path)           # stale: we hold the key lock, no live worker owns it
        except FileNotFoundError:
            pass
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)         # socket 0600: a call runs arbitrary importable code
        try:
            sock.bind(str(path))
        finally:
            os.umask(old)
        sock.listen(128)
        sock.settimeout(0.2)
        self._listener = sock

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while True:
            with self._cond:
                if self._draining:
                    break
            try:
                conn, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError as exc:
                log.warning("accept failed: %s", exc)
                time.sleep(0.1)
                continue
            with self._cond:
                full = self._in_flight >= MAX_CONNECTIONS
                if not full:
                    self._in_flight += 1
            if full:
                log.warning("refused a connection: %d already being read", MAX_CONNECTIONS)
                conn.close()
                continue
            threading.Thread(target=self._handle, args=(conn,), name="conn", daemon=True).start()
        self._listener.close()

    def _handle(self, conn: socket.socket) -> None:
        handed_off = False
        try:
            creds = peer_credentials(conn)
            if creds is not None and creds[1] != os.getuid():
                # Another user reached the socket (a loosened mode, a shared folder): say
                # nothing, not even the hello.
                log.warning("refused a connection from pid %d, uid %d (this worker serves "
                            "uid %d only)", creds[0], creds[1], os.getuid())
                self._event("refused", peer_pid=creds[0], peer_uid=creds[1])
                return
            deadline = time.monotonic() + REQUEST_DEADLINE_S
            conn.settimeout(REQUEST_READ_TIMEOUT)
            send_message(conn, self._hello())
            try:
                req = recv_message(conn, MAX_REQUEST_BYTES, deadline)
            except MessageTooLarge as exc:
                log.warning("refused a request: %s", exc)
                send_message(conn, {"ok": False, "phase": "call", "error_type": "MessageTooLarge",
                                    "safetyrepro_error": False, "fatal": False, "retry": False,
                                    "message": str(exc), "traceback": ""})
                return
            if not isinstance(req.get("op"), str):
                req = {"op": repr(req.get("op"))[:100]}
            op = req.get("op")
            if op == "status":
                send_message(conn, {"ok": True, "result": self.status()})
            elif op == "shutdown":
                self.request_drain(str(req.get("reason") or "shutdown request"))
                send_message(conn, {"ok": True, "result": {"pid": self.pid, "draining": True}})
            elif op == "call":
                if not isinstance(req.get("target"), str) or not isinstance(req.get("kwargs", {}), dict):
                    send_message(conn, {"ok": False, "phase": "call", "error_type": "ProtocolError",
                                        "safetyrepro_error": False, "fatal": False, "retry": False,
                                        "message": "call needs 'target' (str) and 'kwargs' (object)",
                                        "traceback": ""})
                    return
                if not is_allowed(req["target"], ALLOWED_TARGETS, self.test_modules):
                    log.warning("refused a call of %r: not one of this worker's calls", req["target"])
                    self._event("refused", target=str(req["target"])[:200])
                    send_message(conn, {"ok": False, "phase": "call", "error_type": "TargetNotAllowed",
                                        "safetyrepro_error": False, "fatal": False, "retry": False,
                                        "message": f"{req['target']!r} is not one of this worker's "
                                                   f"calls (allowed: {sorted(ALLOWED_TARGETS)})",
                                        "traceback": ""})
                    return
                reply = None
                with self._cond:
                    if self._load_error is not None:
                        reply = self._load_error
                    elif self._draining:
                        reply = retry_reply(self._drain_reason or "draining")
                    else:
                        if isinstance(req.get("run"), str):
                            self._runs[run_token(req["run"])] = time.time()
                        conn.settimeout(None)
                        self._queue.append(_Job(conn, req))
                        handed_off = True
                        self._cond.notify_all()
                if reply is not None:
                    send_message(conn, reply)
            else:
                send_message(conn, {"ok": False, "phase": "call", "error_type": "ProtocolError",
                                    "safetyrepro_error": False, "fatal": False, "retry": False,
                                    "message": f"unknown op {op!r}", "traceback": ""})
        except (ProtocolError, OSError) as exc:
            log.debug("connection dropped: %s", exc)
        finally:
            if not handed_off:
                conn.close()
            with self._cond:
                self._in_flight -= 1
                self._cond.notify_all()

    # ---- owner watch ------------------------------------------------------------------
    def _watch_owner(self) -> None:
        """Drain once the owner is gone; if a call still runs after OWNER_GRACE_S, exit
        anyway (nobody is left to receive its answer, and shards are written atomically)."""
        assert self.owner is not None
        while owner_alive(self.owner):
            time.sleep(OWNER_POLL_S)
        reason = f"owner process {self.owner.split(':')[0]} exited"
        self.request_drain(reason)
        time.sleep(OWNER_GRACE_S)
        with self._cond:
            busy = self._current is not None or self._phase == "loading"
            label = (self._current.label or self._current.target) if self._current else self._phase
        if not busy:
            return                # the main thread finishes the normal way
        log.warning("%s while %s was running: exiting without finishing it", reason, label)
        self._event("exit", reason=reason, code=EXIT_FAILED, n_calls=self._n_calls,
                    uptime_s=round(time.time() - self._started, 3), abandoned=label)
        remove_if_owned(self.paths.pid, self.pid)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_FAILED)

    # ---- main thread ------------------------------------------------------------------
    def _write_pid_file(self) -> None:
        write_pid_file(self.paths.pid, {
            "pid": self.pid, "key": self.key, "host": self.host, "sock": str(self.paths.sock),
            "spec": self.spec, "loader": self.loader, "started": self._started,
            "idle_timeout": self.idle_timeout, "slots": self.slots,
            "allocation": self.allocation, "owner": self.owner})
        self._key_lock.write_holder({"pid": self.pid, "key": self.key, "host": self.host})

    def _acquire_device(self) -> bool:
        """Take a free device slot; False if the worker was told to stop before it got one
        (queued calls are answered "retry") or the wait ran out."""
        self._phase = "waiting_device"

        def stop_requested() -> bool:
            with self._cond:
                if self._draining:
                    # Told to stop before loading: do not load just to serve the queue (the
                    # device holder may be idle with nobody asking it to leave).
                    log.info("stopping before loading (%s); %d queued call(s) will be retried",
                             self._drain_reason, len(self._queue))
                return self._draining

        return self._device.acquire(stop_requested)

    def _load(self) -> bool:
        self._phase = "loading"
        t_start = time.time()
        log.info("loading %s via %s(%s)", self.key, self.loader, self.loader_args)
        try:
            fn = resolve_callable(self.loader)
            state = fn(**self.loader_args)
        except Exception as exc:  # noqa: BLE001 - reported to every client
            seconds = time.time() - t_start
            log.error("loading %s failed after %.1f s:\n%s", self.key, seconds,
                      "".join(traceback.format_exception(exc)))
            self._event("load", t_start=t_start, seconds=round(seconds, 6), ok=False,
                        loader=self.loader, error_type=type(exc).__name__)
            reply = error_reply(exc, "load", fatal=True,
                                message=f"loading {self.key} with {self.loader} failed: "
                                        f"{type(exc).__name__}: {exc}")
            with self._cond:
                self._load_error = reply
                self._phase = "failed"
                self._start_drain_locked("load failed")
                waiting = list(self._queue)
                self._queue.clear()
            for job in waiting:
                self._send_and_close(job, encode_message(reply))
            return False
        seconds = time.time() - t_start
        self._state = state
        self._load_seconds = seconds
        log.info("loaded %s in %.2f s", self.key, seconds)
        self._event("load", t_start=t_start, seconds=round(seconds, 6), ok=True, loader=self.loader)
        with self._cond:
            self._phase = "ready"
            self._last_activity = time.monotonic()
        return True

    def _fail_with(self, message: str, error_type: str) -> None:
        """Answer every waiting and later client with a load-phase error, as after a failed
        load (the worker then exits)."""
        reply = {"ok": False, "phase": "load", "error_type": error_type, "safetyrepro_error": True,
                 "message": message, "traceback": "", "fatal": True, "retry": False}
        with self._cond:
            self._load_error = reply
            self._phase = "failed"
            self._start_drain_locked(error_type)
            waiting = list(self._queue)
            self._queue.clear()
        for job in waiting:
            self._send_and_close(job, encode_message(reply))

    # ---- watchdog ---------------------------------------------------------------------
    def _watchdog(self) -> None:
        """Ends the process when a call runs past its deadline (``timeout_s`` of the request):
        a hung kernel or a deadlock cannot be interrupted from Python, so the call is
        answered with the error here, queued calls are answered "retry", and the process
        exits (its device lock with it)."""
        while True:
            time.sleep(WATCHDOG_POLL_S)
            job, deadline = self._current, self._deadline
            if job is None or deadline is None or time.monotonic() < deadline:
                continue
            secs = float(job.request.get("timeout_s") or 0)
            what = job.label or job.target
            message = (f"{what} ran past its deadline of {secs:g} s (runtime.cell_timeout_s) in the "
                       f"worker for {self.key} (pid {self.pid}), which exits: a stuck call (a hung "
                       "kernel, a deadlock) cannot be interrupted in place. Rerunning starts a "
                       "fresh worker; raise runtime.cell_timeout_s if the cell is merely slow")
            log.error(message)
            self._event("timeout", target=job.target, label=job.label, timeout_s=secs)
            self._send_and_close(job, encode_message({
                "ok": False, "phase": "call", "error_type": "CellTimeout", "safetyrepro_error": True,
                "message": message, "traceback": "", "fatal": True, "retry": False}))
            got = self._cond.acquire(timeout=2.0)
            try:
                self._draining = True
                waiting = list(self._queue)
                self._queue.clear()
            finally:
                if got:
                    self._cond.release()
            for other in waiting:
                self._send_and_close(other, encode_message(retry_reply("call timeout")))
            try:
                os.unlink(self.paths.sock)
            except OSError:
                pass
            remove_if_owned(self.paths.pid, self.pid)
            self._event("exit", reason=f"call timeout ({what})", code=EXIT_FAILED,
                        n_calls=self._n_calls, uptime_s=round(time.time() - self._started, 3))
            sys.stderr.flush()
            os._exit(EXIT_FAILED)

    def _send_and_close(self, job: _Job, frame: bytes) -> None:
        try:
            job.conn.settimeout(REPLY_SEND_TIMEOUT_S)   # a client that never reads cannot hold us
            send_frame(job.conn, frame)
        except OSError as exc:
            log.warning("could not answer %s (client gone?): %s", job.label or job.target, exc)
        finally:
            job.conn.close()

    def _run_job(self, job: _Job) -> BaseException | None:
        """Run one call and answer it. Returns the exception if it was fatal."""
        what = job.label or job.target
        if _client_gone(job.conn):
            log.info("skipping %s: its client has gone away", what)
            self._event("skip", target=job.target, label=job.label)
            job.conn.close()
            return None
        t_start = time.time()
        log.info("call %s (%s)", job.target, what)
        fatal: BaseException | None = None
        error_type = None
        timeout = job.request.get("timeout_s")
        self._deadline = (time.monotonic() + float(timeout)
                          if isinstance(timeout, (int, float)) and timeout > 0 else None)
        try:
            fn = resolve_callable(job.target)
            result = fn(self._state, **(job.request.get("kwargs") or {}))
            try:
                frame = encode_message({"ok": True, "result": result})
            except (TypeError, ValueError) as exc:
                raise TypeError(f"result of {job.target} is not JSON-serializable: {exc}") from exc
        except Exception as exc:  # noqa: BLE001 - answered to the client
            error_type = type(exc).__name__
            fatal = exc if is_fatal(exc) else None
            log.error("call %s (%s) failed%s:\n%s", job.target, what,
                      " (fatal: worker will exit)" if fatal else "",
                      "".join(traceback.format_exception(exc)))
            frame = encode_message(error_reply(exc, "call", fatal=fatal is not None))
        except BaseException as exc:
            error_type = type(exc).__name__
            fatal = exc
            log.error("call %s (%s) interrupted by %s: worker will exit", job.target, what, error_type)
            frame = encode_message(error_reply(exc, "call", fatal=True,
                                               message=f"worker interrupted by {error_type}"))
        self._deadline = None
        seconds = time.time() - t_start
        # Event first: whoever reads the events after getting the reply sees this call.
        self._event("call", target=job.target, label=job.label, t_start=t_start,
                    seconds=round(seconds, 6), ok=error_type is None,
                    **({"error_type": error_type} if error_type else {}))
        self._send_and_close(job, frame)
        if error_type is not None:
            _free_accelerator_cache()
        return fatal

    def _serve_loop(self) -> BaseException | None:
        while True:
            with self._cond:
                while not self._queue:
                    if self._draining:
                        if self._in_flight == 0:
                            return None
                        if time.monotonic() - self._drain_started > DRAIN_DEADLINE_S:
                            log.warning("drained with %d connection(s) still being read after %.0f s",
                                        self._in_flight, DRAIN_DEADLINE_S)
                            return None
                        self._cond.wait(0.2)
                        continue
                    idle = time.monotonic() - self._last_activity
                    if idle >= self.idle_timeout and self._in_flight == 0:
                        self._start_drain_locked(f"idle for {idle:.0f} s")
                        continue
                    self._cond.wait(max(0.05, min(self.idle_timeout - idle, 1.0)))
                job = self._queue.popleft()
                self._current = job
            fatal = self._run_job(job)
            with self._cond:
                self._current = None
                self._n_calls += 1
                self._last_activity = time.monotonic()
            if fatal is not None:
                return fatal

    def _fail_queued(self, reason: str) -> None:
        with self._cond:
            self._start_drain_locked(reason)
            waiting = list(self._queue)
            self._queue.clear()
        for job in waiting:
            self._send_and_close(job, encode_message(retry_reply(reason)))

    def _finish(self, code: int, reason: str) -> None:
        self.request_drain(reason)
        if self._acceptor is not None:
            self._acceptor.join(timeout=2.0)        # no new connections after this
        with self._cond:                            # let accepted ones get their answer
            deadline = time.monotonic() + 3.0
            while self._in_flight and time.monotonic() < deadline:
                self._cond.wait(0.1)
        self._fail_queued(reason)
        self._event("exit", reason=self._drain_reason or reason, code=code, n_calls=self._n_calls,
                    uptime_s=round(time.time() - self._started, 3))
        remove_if_owned(self.paths.pid, self.pid)
        log.info("exiting (%s) after %d call(s)", self._drain_reason or reason, self._n_calls)
        # The device lock is released by the process exit itself (after the accelerator
        # memory is gone), not here.

    def run(self, on_ready: Callable[[], None] | None = None) -> int:
        """Serve until drained; returns the process exit code."""
        self.pid = os.getpid()          # after a fork, the child's
        self._device = self._device_slot()
        self._started = time.time()
        self._write_pid_file()
        self._bind()
        signal.signal(signal.SIGTERM, self._on_sigterm)
        self._event("start", loader=self.loader, spec=self.spec, sock=str(self.paths.sock))
        log.info("worker for %s listening on %s", self.key, self.paths.sock)
        if on_ready is not None:
            on_ready()
        self._acceptor = threading.Thread(target=self._accept_loop, name="accept", daemon=True)
        self._acceptor.start()
        if self.owner is not None:
            threading.Thread(target=self._watch_owner, name="owner", daemon=True).start()
        threading.Thread(target=self._watchdog, name="watchdog", daemon=True).start()
        code, reason = EXIT_OK, "exit"
        try:
            if not self._acquire_device():
                if self._device.timeout_message is not None:
                    code, reason = EXIT_FAILED, "device wait timed out"
                    self._fail_with(self._device.timeout_message, "DeviceBusy")
                else:
                    reason = self._drain_reason or "stopped"
            elif not self._load():
                code, reason = EXIT_FAILED, "load failed"
            else:
                fatal = self._serve_loop()
                if fatal is not None:
                    code, reason = EXIT_FAILED, f"fatal {type(fatal).__name__} in a call"
                    self._fail_queued(reason)
        except BaseException as exc:  # noqa: BLE001 - KeyboardInterrupt, SystemExit, bugs
            code, reason = EXIT_FAILED, f"fatal {type(exc).__name__}"
            log.error("worker failing: %s", "".join(traceback.format_exception(exc)))
        finally:
            self._finish(code, reason)
        return code


def _setup_logging() -> None:
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(
            "%(asctime)s worker[%(process)d] %(levelname)s %(message)s"))
        root.addHandler(handler)
    root.setLevel(logging.INFO)


def serve(state_dir: str | os.PathLike, key: str, loader: str, loader_args: dict[str, Any],
          idle_timeout: float, slots: int = 1, detach: bool = False,
          owner: str | None = None, device_wait: float | None = None) -> int:
    """Run a worker for ``key``; returns the exit status.

    With ``detach`` the calling process forks: the child (in a new session) becomes the
    worker, and the parent returns 0 once the child's socket is listening, or 1 if the child
    died before that. Returns 3 at once if a worker for ``key`` already holds its key lock."""
    _setup_logging()
    paths = WorkerPaths(state_dir, key)
    paths.ensure_dir()
    for slot in range(max(int(slots), 1)):
        # Open (create) the device lock files now, so that a planted link or foreign file
        # fails the start with its name rather than a worker that has already said "ready".
        os.close(open_private(paths.device_lock(slot), os.O_RDWR | os.O_CREAT))
    key_lock = FileLock(paths.key_lock)
    if not key_lock.acquire(timeout=2.0):
        log.error("a worker for %s is already running: %s", key, read_holder(paths.key_lock))
        return EXIT_ALREADY_RUNNING
    worker = Worker(paths, key_lock, loader, loader_args, idle_timeout, slots, owner,  # validates
                    device_wait=device_wait)
    ready_fd: int | None = None
    if detach:
        r, w = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        child = os.fork()
        if child:
            # Launcher: wait for the worker to be listening. Do NOT release the key lock:
            # the lock is shared with the child through the inherited descriptor.
            os.close(w)
            with os.fdopen(r, "rb") as fh:
                got = fh.read()
            if got.startswith(b"ready"):
                return EXIT_OK
            try:
                os.waitpid(child, os.WNOHANG)
            except ChildProcessError:
                pass
            log.error("worker for %s (pid %d) exited before it was ready", key, child)
            return EXIT_FAILED
        os.close(r)
        os.setsid()
        ready_fd = w

    def on_ready() -> None:
        if ready_fd is not None:
            os.write(ready_fd, b"ready\n")
            os.close(ready_fd)

    return worker.run(on_ready)
