"""The prefill store: prefixes and batch prefills kept across calls on one model."""

from __future__ import annotations

import torch


class PrefillStore:
    """Prefills kept across calls on one model, least recently used out first, within a byte
    budget (keys/values, masks and logits counted).

    The cells of a (template, shots) pair render the same prompts under every decoding, and
    free-form and logprob cells share few-shot prefixes, so the worker passes one store per
    model to :func:`build_prefix` and :func:`prefill`. Entries are never written after they
    are stored and a prefill is deterministic, so a hit equals recomputing."""

    def __init__(self, max_bytes: int = 2 << 30):
        from collections import OrderedDict

        self.max_bytes = int(max_bytes)
        self._items: OrderedDict = OrderedDict()
        self.bytes = 0
        self.hits = 0
        self.misses = 0

    def get(self, key):
        item = self._items.get(key)
        if item is None:
            self.misses += 1
            return None
        self._items.move_to_end(key)
        self.hits += 1
        return item[0]

    def put(self, key, value, nbytes: int) -> None:
        if nbytes > self.max_bytes or key in self._items:
            return
        self._items[key] = (value, nbytes)
        self.bytes += nbytes
        while self.bytes > self.max_bytes:
            _, (_, freed) = self._items.popitem(last=False)
            self.bytes -= freed

    def __len__(self) -> int:
        return len(self._items)

    def discard(self, kind: str) -> int:
        """Drop every entry of ``kind`` (``"batch"`` or ``"prefix"``); returns how many. After
        an out-of-memory error the failed batch's prefill is of no further use (its halves
        prefill anew) and its memory is wanted back."""
        gone = [k for k in self._items if k[0] == kind]
        for k in gone:
            self.bytes -= self._items.pop(k)[1]
        return len(gone)


def _nbytes(*objs) -> int:
    """Bytes held by tensors and caches (their layers' keys and values)."""
    total = 0
    for obj in objs:
        if isinstance(obj, torch.Tensor):
            total += obj.numel() * obj.element_size()
        elif obj is not None:
            for layer in getattr(obj, "layers", []):
                for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
                    if isinstance(t, torch.Tensor):
                        total += t.numel() * t.element_size()
    return total
