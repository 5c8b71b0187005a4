"""Seeded, machine-independent randomness for item handling.

Everything random in items/ (choice shuffles, subset and few-shot selection, tie-breaks,
subsamples) derives from sha256 of explicit parts, never from Python's salted ``hash()``,
set/dict order or a numpy bit-stream (whose algorithms may change between releases)."""

from __future__ import annotations

import hashlib
from typing import Sequence


def stable_int(*parts: object) -> int:
    """A 64-bit unsigned integer from sha256 of the parts (joined with U+001F)."""
    data = "\x1f".join(str(p) for p in parts).encode("utf-8")
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "big")


def hash_order(keys: Sequence[object], *parts: object) -> list[int]:
    """Positions of ``keys`` sorted by ``stable_int(*parts, key)`` (ties by key text):
    a seeded random order that does not depend on the order ``keys`` come in."""
    return sorted(range(len(keys)), key=lambda i: (stable_int(*parts, keys[i]), str(keys[i])))


def permutation(n: int, *parts: object) -> list[int]:
    """A seeded permutation of ``range(n)``: ``perm[j]`` is the original position placed at j."""
    return hash_order(list(range(n)), *parts)

