"""What one client can hold of a worker is bounded (real workers, as in test_worker.py): a
request trickled a byte at a time is cut at its whole-message deadline, so it cannot keep a
draining worker alive; connections read at once are capped; an oversized frame is refused
with an error reply and the worker keeps serving; run ids of any length name their leases."""

from __future__ import annotations

import socket
import struct
import time

import pytest

from safetyrepro.worker import stop_workers
from safetyrepro.worker.protocol import MAX_REQUEST_BYTES, ConnectionClosed, recv_message
from safetyrepro.procs import pid_alive
from safetyrepro.worker.layout import WorkerPaths, check_key, run_token
from safetyrepro.worker.pidfiles import read_pid_file
from test_worker import ENV, call, device_dir, sd  # noqa: F401 - fixtures used by name

DEADLINE = 1.5


@pytest.fixture
def limited(monkeypatch):
    monkeypatch.setitem(ENV, "SAFETYREPRO_WORKER_REQUEST_DEADLINE_S", str(DEADLINE))
    monkeypatch.setitem(ENV, "SAFETYREPRO_WORKER_MAX_CONNECTIONS", "4")


def _connect(sd, key="m1"):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(read_pid_file(WorkerPaths(sd, key).pid)["sock"])
    return s


def _closed(s) -> bool:
    try:
        return s.recv(1) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True


def test_a_trickled_request_is_cut_at_its_deadline(sd, limited):
    pid = call(sd, "m1", "echo")["pid"]
    s = _connect(sd)
    recv_message(s)                                    # the hello
    t0 = time.monotonic()
    s.settimeout(0.25)
    frame = struct.pack(">I", 1000)
    closed = False
    for i in range(40):                                # a byte every 0.25 s: each recv is quick
        try:
            s.send(frame[i % 4:i % 4 + 1])
            if s.recv(1) == b"":
                closed = True
                break
        except socket.timeout:
            continue
        except (ConnectionResetError, BrokenPipeError):
            closed = True
            break
    assert closed and DEADLINE - 0.1 <= time.monotonic() - t0 < DEADLINE + 2
    s.close()
    assert call(sd, "m1", "echo")["pid"] == pid        # the worker serves on


def test_a_trickling_client_does_not_keep_a_draining_worker_alive(sd, limited):
    pid = call(sd, "m1", "echo")["pid"]
    s = _connect(sd)
    recv_message(s)
    s.send(b"\0")                                      # one byte of a header, then nothing
    t0 = time.monotonic()
    (row,) = stop_workers(sd, timeout=DEADLINE + 8)
    # it drained and exited by itself once the request's deadline passed (not killed)
    assert row["outcome"] == "stopped" and not pid_alive(pid)
    assert time.monotonic() - t0 < DEADLINE + 5
    s.close()


def test_connections_read_at_once_are_capped(sd, limited):
    pid = call(sd, "m1", "echo")["pid"]
    held = [_connect(sd) for _ in range(4)]
    for s in held:
        recv_message(s)
    extra = _connect(sd)
    with pytest.raises(ConnectionClosed):
        recv_message(extra)                            # closed at accept: not even a hello
    for s in held:
        s.close()
    time.sleep(0.3)
    assert call(sd, "m1", "echo")["pid"] == pid


def test_an_oversized_frame_gets_an_error_reply(sd):
    pid = call(sd, "m1", "echo")["pid"]
    s = _connect(sd)
    recv_message(s)
    s.sendall(struct.pack(">I", MAX_REQUEST_BYTES + 1) + b"{")
    reply = recv_message(s)
    assert reply["ok"] is False and reply["error_type"] == "MessageTooLarge"
    assert str(MAX_REQUEST_BYTES) in reply["message"]
    s.close()
    assert call(sd, "m1", "echo")["pid"] == pid


def test_run_ids_of_any_length_name_their_leases(sd, monkeypatch):
    from safetyrepro.worker.lifecycle import hold_run_lease, run_lease_path, stop_run_workers

    long_id = "run-" + "x" * 300
    other = "run-" + "x" * 299 + "y"
    assert run_token(long_id) != run_token(other) and check_key(run_token(long_id)) == run_token(long_id)
    assert run_token("run-a") == "run-a"
    assert run_token("run-a\n") != "run-a\n"                    # a newline never names a file
    lease = hold_run_lease(sd, other)                          # another live run with a long id
    monkeypatch.setenv("SAFETYREPRO_RUN_ID", long_id)
    shared = call(sd, "m1", "echo")["pid"]
    monkeypatch.setenv("SAFETYREPRO_RUN_ID", other)
    assert call(sd, "m1", "echo")["pid"] == shared
    assert run_lease_path(sd, other).exists()
    rows = {r["key"]: r for r in stop_run_workers(sd, long_id, timeout=10)}
    assert rows["m1"]["outcome"].startswith("kept for run run-h") and pid_alive(shared)
    lease.release()
    rows = {r["key"]: r for r in stop_run_workers(sd, long_id, timeout=10)}
    assert rows["m1"]["outcome"] == "stopped" and not pid_alive(shared)
