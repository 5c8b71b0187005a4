"""A reader of the key/value metadata in a GGUF file's header (GGUF spec, ggml's
``docs/gguf.md``), read sequentially, so the first split part of a GGUF inside a wheel is
enough (e.g. for its chat template)."""

from __future__ import annotations

import struct
from typing import Any

from ...errors import ModelError

# GGUF metadata value types (GGUF spec, ggml's docs/gguf.md): id -> struct format (None: string,
# "array": typed array).
_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
                 10: "<Q", 11: "<q", 12: "<d"}
_GGUF_STRING, _GGUF_ARRAY = 8, 9


def read_gguf_metadata(stream, keys: set[str] | None = None) -> dict[str, Any]:
    """Key/value metadata from the header of a GGUF file read sequentially from ``stream``
    (e.g. the first split part of a GGUF inside a wheel: the header needs no tensor data).
    With ``keys``, stops once all of them were read and returns only those; arrays are skipped
    over (returned as their length) unless asked for. ModelError on a malformed header."""
    def take(n: int) -> bytes:
        b = stream.read(n)
        if len(b) != n:
            raise ModelError("GGUF header ends early")
        return b

    def num(fmt: str):
        return struct.unpack(fmt, take(struct.calcsize(fmt)))[0]

    def string() -> str:
        return take(num("<Q")).decode("utf-8", errors="replace")

    def value(vtype: int, keep: bool):
        if vtype in _GGUF_SCALARS:
            return num(_GGUF_SCALARS[vtype])
        if vtype == _GGUF_STRING:
            return string()
        if vtype == _GGUF_ARRAY:
            etype, n = num("<I"), num("<Q")
            items = [value(etype, keep) for _ in range(n)]
            return items if keep else n
        raise ModelError(f"GGUF header: unknown value type {vtype}")

    if take(4) != b"GGUF":
        raise ModelError("not a GGUF file (bad magic)")
    version = num("<I")
    if version < 2:
        raise ModelError(f"GGUF version {version} is not supported (needs >= 2)")
    num("<Q")  # tensor count
    n_kv = num("<Q")
    out: dict[str, Any] = {}
    for _ in range(n_kv):
        key = string()
        want = keys is None or key in keys
        val = value(num("<I"), keep=want)
        if want:
            out[key] = val
            if keys is not None and keys <= out.keys():
                break
    return out
