"""The device slot a worker holds while its model is loaded: one of ``slots`` flocks per node
and device (:func:`.layout.device_lock_dir`), shared by every run of this user on the node. A
worker waits for a free slot, names the holders while it waits, and gives up after
``runtime.device_wait_s``; the lock goes with the process (after the accelerator memory)."""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

from .layout import WorkerPaths
from .locks import FileLock, read_holder

log = logging.getLogger("safetyrepro.worker")

DEVICE_POLL_S = 0.1
DEVICE_LOG_EVERY_S = 30.0


def _describe_holder(path) -> str:
    h = read_holder(path) or {}
    if not h:
        return f"an unknown process ({path})"
    since = time.strftime("%H:%M:%S", time.localtime(h["t"])) if isinstance(h.get("t"), (int, float)) else "?"
    return (f"worker pid {h.get('pid')} for {h.get('key')} (state folder {h.get('state_dir', '?')}, "
            f"since {since}; lock {path})")


class DeviceSlot:
    """Acquires one of a worker's device slots (:meth:`acquire`); ``slot`` and ``lock`` name
    the one held, ``timeout_message`` why none was taken within ``wait`` seconds."""

    def __init__(self, paths: WorkerPaths, slots: int, holder: dict[str, Any], wait: float | None,
                 event: Callable[..., None]):
        self.paths = paths
        self.holder = holder    # written into the lock: who holds it (pid, key, host)
        self.wait = wait
        self.event = event      # the worker's event log
        self.locks = [FileLock(paths.device_lock(s)) for s in range(slots)]
        self.lock: FileLock | None = None
        self.slot: int | None = None
        self.timeout_message: str | None = None

    def acquire(self, stop_requested: Callable[[], bool]) -> bool:
        """Take a free slot; False when ``stop_requested()`` turns true first (the worker was
        told to stop) or the wait runs out (``timeout_message`` says so, naming the holders)."""
        t0 = time.monotonic()
        last_log = t0
        while True:
            for slot, lock in enumerate(self.locks):
                if lock.acquire(timeout=0):
                    lock.write_holder({**self.holder, "t": time.time(), "state_dir": str(self.paths.state_dir)})
                    self.lock, self.slot = lock, slot
                    waited = time.monotonic() - t0
                    if waited > 1:
                        log.info("got device slot %d after waiting %.1f s", slot, waited)
                    self.event("device", slot=slot, waited_s=round(waited, 6))
                    return True
            if stop_requested():
                return False
            now = time.monotonic()
            if self.wait is not None and now - t0 >= self.wait:
                holders = "; ".join(_describe_holder(lk.path) for lk in self.locks)
                self.timeout_message = (
                    f"waited {now - t0:.0f} s (runtime.device_wait_s) for the device to load "
                    f"{self.paths.key}; it is held by {holders}. Stop that worker (`safetyrepro "
                    "worker stop`, with its state folder) or wait for it to finish, then rerun")
                log.error(self.timeout_message)
                self.event("device_timeout", waited_s=round(now - t0, 3))
                return False
            if now - last_log >= DEVICE_LOG_EVERY_S:
                log.info("waiting %.0f s for the device, held by %s", now - t0,
                         [read_holder(lk.path) for lk in self.locks])
                last_log = now
            time.sleep(DEVICE_POLL_S)
