"""The wire protocol between a cell client and a persistent worker.

Messages are JSON objects, each framed by a 4-byte big-endian length, over a Unix domain
stream socket. One connection carries one exchange:

    worker -> client   {"hello": 1, "protocol": 1, "pid", "key", "host", "spec", "phase", ...}
    client -> worker   {"op": "call", "target": "module:function", "kwargs": {...}, "label": str}
                     | {"op": "status"}
                     | {"op": "shutdown", "reason": str}
    worker -> client   {"ok": true, "result": <json>}
                     | {"ok": false, "error_type", "message", "traceback", "phase", "fatal", "retry"}

``retry: true`` means the request was not run (the worker is shutting down); the client tries
again, starting a fresh worker if needed. A connection that closes before the hello never
reached a worker; one that closes after the hello, before the reply, means the worker died.

This module is imported by every cell job: standard library only.
"""

from __future__ import annotations

import json
import socket
import struct
import time
TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (client start-up)
if TYPE_CHECKING:
    from typing import Any

PROTOCOL_VERSION = 1
# Messages are small (a cell request names files; a reply is a summary): 16 MiB bounds what a
# peer can make the other side buffer; a worker takes requests of at most MAX_REQUEST_BYTES.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
MAX_REQUEST_BYTES = 1024 * 1024
_HEADER = struct.Struct(">I")


def peer_credentials(sock: socket.socket) -> tuple[int, int, int] | None:
    """(pid, uid, gid) of the process at the other end of a connected Unix socket (for a
    listening peer: as of its ``listen()``), from SO_PEERCRED; None where the platform has no
    SO_PEERCRED (there only the socket's 0600 mode and its 0700 folder keep others out)."""
    opt = getattr(socket, "SO_PEERCRED", None)
    if opt is None:
        return None
    raw = sock.getsockopt(socket.SOL_SOCKET, opt, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return pid, uid, gid


class ProtocolError(Exception):
    """A malformed frame or message (not a SafetyReproError: a bug or a foreign peer)."""


class MessageTooLarge(ProtocolError):
    """A frame announced more bytes than the receiver takes (its body is not read)."""

    def __init__(self, length: int, limit: int):
        super().__init__(f"announced message length {length} exceeds the {limit}-byte limit")
        self.length, self.limit = length, limit


class MessageTimeout(ProtocolError):
    """A whole message did not arrive within its deadline (a peer trickling bytes)."""


class ConnectionClosed(ProtocolError):
    """The peer closed the connection (``clean`` when it closed between messages)."""

    def __init__(self, message: str, clean: bool):
        super().__init__(message)
        self.clean = clean


def encode_message(obj: dict[str, Any]) -> bytes:
    """Frame ``obj`` as length + JSON (TypeError/ValueError if it is not JSON-serializable)."""
    data = json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    if len(data) > MAX_MESSAGE_BYTES:
        raise ValueError(f"message of {len(data)} bytes exceeds the {MAX_MESSAGE_BYTES}-byte limit")
    return _HEADER.pack(len(data)) + data


def send_message(sock: socket.socket, obj: dict[str, Any]) -> None:
    sock.sendall(encode_message(obj))


def send_frame(sock: socket.socket, frame: bytes) -> None:
    """Send an already encoded message (see :func:`encode_message`)."""
    sock.sendall(frame)


def _recv_exactly(sock: socket.socket, n: int, what: str, deadline: float | None = None) -> bytes:
    chunks = []
    got = 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise MessageTimeout(f"{what} not complete in time ({got}/{n} bytes)")
            sock.settimeout(left)
        try:
            chunk = sock.recv(min(n - got, 1 << 20))
        except socket.timeout as exc:
            if deadline is not None:
                raise MessageTimeout(f"{what} not complete in time ({got}/{n} bytes)") from exc
            raise
        except (ConnectionResetError, BrokenPipeError) as exc:
            raise ConnectionClosed(f"connection reset while reading {what}: {exc}", clean=False) from exc
        if not chunk:
            raise ConnectionClosed(f"connection closed while reading {what} ({got}/{n} bytes)",
                                   clean=(got == 0 and what == "header"))
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def recv_message(sock: socket.socket, max_bytes: int = MAX_MESSAGE_BYTES,
                 deadline: float | None = None) -> dict[str, Any]:
    """Read one framed JSON object; ConnectionClosed if the peer went away, MessageTooLarge
    past ``max_bytes``, MessageTimeout if it is not complete by ``deadline`` (monotonic)."""
    (length,) = _HEADER.unpack(_recv_exactly(sock, _HEADER.size, "header", deadline))
    if length > max_bytes:
        raise MessageTooLarge(length, max_bytes)
    body = _recv_exactly(sock, length, "body", deadline)
    try:
        obj = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ProtocolError(f"message is not UTF-8 JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise ProtocolError(f"message is a {type(obj).__name__}, expected a JSON object")
    return obj
