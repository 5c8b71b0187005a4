"""Length-sorted batching, out-of-memory fallback and progress reporting."""

from __future__ import annotations

import gc
import sys
from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch

from ..errors import CellError


def length_batches(lengths: list[int], batch_size: int) -> list[list[int]]:
    """Indices grouped into batches of at most ``batch_size``, longest first (so padding is
    small and an out-of-memory error shows up on the first batch). Ties keep input order."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


def is_oom(exc: BaseException) -> bool:
    if isinstance(exc, getattr(torch, "OutOfMemoryError", ())) or \
            isinstance(exc, getattr(torch.cuda, "OutOfMemoryError", ())):
        return True
    msg = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in msg or "can't allocate memory" in msg)


def free_memory() -> None:
    """Release what a failed attempt left behind: collect unreachable objects (a traceback's
    frames can sit in reference cycles) and hand the CUDA caching allocator's free blocks
    back, so the retry starts from the memory the failed attempt had before it began."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@dataclass(frozen=True)
class Split:
    """One out-of-memory split: ``rows`` (the batch's item indices) failed during ``what`` and
    were retried as ``into`` (the two halves' sizes)."""
    what: str
    rows: tuple[int, ...]
    into: tuple[int, int]
    error: str

    def as_dict(self) -> dict:
        return {"what": self.what, "batch_size": len(self.rows), "first_item": self.rows[0],
                "into": list(self.into), "error": self.error}


def run_with_oom_fallback(rows: list[int], fn: Callable[[list[int]], dict], *, what: str,
                          device: str, n_tokens: Callable[[list[int]], int],
                          splits: list[Split] | None = None,
                          on_oom: Callable[[], None] | None = None) -> dict:
    """``fn(rows)`` -> {row: result}. On out-of-memory the batch is halved and each half run in
    turn (down to single rows); a single row that still does not fit raises CellError.

    The retry runs outside the ``except`` block, whose traceback would keep the failed
    attempt's tensors alive; :func:`free_memory` and ``on_oom`` (the caller's own caches) run
    before the first half. Every split is appended to ``splits`` and reported on stderr."""
    out: dict = {}
    todo = [list(rows)]  # a stack: the first half runs (and splits further) before the second
    while todo:
        part = todo.pop()
        error = None
        try:
            out.update(fn(part))
        except Exception as exc:  # noqa: BLE001 - filtered by is_oom
            if not is_oom(exc):
                raise
            if len(part) == 1:
                free_memory()
                raise CellError(
                    f"out of memory on {device} during {what} even at batch size 1 "
                    f"(item {part[0]}, {n_tokens(part)} tokens); use a smaller model, a 4-bit "
                    f"quantization or a device with more memory") from exc
            error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
        if error is None:
            continue
        # out of the handler: the failed attempt's frames and tensors are unreachable here
        if on_oom is not None:
            on_oom()
        free_memory()
        half = len(part) // 2
        split = Split(what, tuple(part), (half, len(part) - half), error)
        if splits is not None:
            splits.append(split)
        print(f"[inference] out of memory on {device} during {what} at batch size {len(part)}; "
              f"retrying as {half} + {len(part) - half}", file=sys.stderr, flush=True)
        todo.append(part[half:])
        todo.append(part[:half])
    return out


@dataclass
class BatchRecord:
    """What the engine decided about its batches during one or more calls, for the caller to
    record (the cells write it into the shard metadata): every out-of-memory split
    (:class:`Split`), every memory plan (:mod:`.memory`) and, per generation call, what its
    decode forwards computed (:class:`.decode.DecodeStats`: forwards, token slots, tokens,
    the distinct positions that computed them, dummy slots, shared tokens; whether the call
    refilled rows from its queue)."""
    splits: list[Split] = field(default_factory=list)
    plans: list[dict] = field(default_factory=list)
    decode: list[dict] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"oom_splits": [s.as_dict() for s in self.splits], "plans": list(self.plans),
                "decode": list(self.decode)}


class Progress:
    """Adapter for the ``progress`` argument: None/False (silent), True (a tqdm bar), an object
    with ``update(n)`` (e.g. a tqdm bar owned by the caller) or a callable ``f(n)``."""

    def __init__(self, progress, total: int, desc: str):
        self._bar = None
        if progress is True:
            from tqdm.auto import tqdm
            self._bar = tqdm(total=total, desc=desc, leave=False)
            self._fn = self._bar.update
        elif progress is None or progress is False:
            self._fn = None
        elif hasattr(progress, "update"):
            self._fn = progress.update
        elif callable(progress):
            self._fn = progress
        else:
            raise TypeError(f"progress must be None, bool, a tqdm-like object or a callable, "
                            f"not {type(progress).__name__}")

    def update(self, n: int) -> None:
        if self._fn is not None:
            self._fn(n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def chunks(seq: list, size: int) -> Iterable[list]:
    for i in range(0, len(seq), size):
        yield seq[i:i + size]
