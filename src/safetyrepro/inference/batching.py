"""Length-sorted batching, out-of-memory fallback and progress reporting."""

from __future__ import annotations

import sys
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
    if isinstance(exc, getattr(torch.cuda, "OutOfMemoryError", ())):
        return True
    msg = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in msg or "can't allocate memory" in msg)


def run_with_oom_fallback(rows: list[int], fn: Callable[[list[int]], dict], *, what: str,
                          device: str, n_tokens: Callable[[list[int]], int]) -> dict:
    """``fn(rows)`` -> {row: result}. On out-of-memory the batch is halved and retried (down
    to single rows); a single row that still does not fit raises CellError."""
    try:
        return fn(rows)
    except Exception as exc:  # noqa: BLE001 - filtered by is_oom
        if not is_oom(exc):
            raise
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        if len(rows) == 1:
            raise CellError(
                f"out of memory on {device} during {what} even at batch size 1 "
                f"(item {rows[0]}, {n_tokens(rows)} tokens); use a smaller model, a 4-bit "
                f"quantization or a device with more memory") from exc
        half = len(rows) // 2
        print(f"[inference] out of memory on {device} during {what} at batch size {len(rows)}; "
              f"retrying as {half} + {len(rows) - half}", file=sys.stderr, flush=True)
        out = run_with_oom_fallback(rows[:half], fn, what=what, device=device, n_tokens=n_tokens)
        out.update(run_with_oom_fallback(rows[half:], fn, what=what, device=device,
                                         n_tokens=n_tokens))
        return out


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
