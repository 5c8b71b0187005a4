"""KV cache layers of the engine: building, forking, reserving and shrinking caches.

A :class:`transformers.DynamicCache` built from the model config never writes its tensors in
place, so a cache is forked by shallow-copying its layers (the fork shares the computed
prefix). For decoding, :func:`reserve` switches a batch to preallocated layers written in
place (:class:`ReservedLayer`, :class:`ReservedSlidingLayer`), since concatenating the cache at
every step reallocates it; finished rows leave in place (:func:`drop_rows`). A call whose
prompts plus new tokens fit a sliding window
(:attr:`.capabilities.Capabilities.window_as_full`) gets full layers only, so packed prefill,
the detached prefix and stream columns work on such models too; so does a call past the window
whose sliding layers get their masks from the engine (``window_mask``).
"""

from __future__ import annotations

import copy

import torch

def new_cache(lm, caps=None):
    """An empty cache for ``lm``: layer kinds from its config (sliding-window layers keep their
    window), or full layers only when ``caps`` (:class:`.capabilities.Capabilities`) treats the
    windows as full attention or masks them itself (``window_mask``)."""
    from transformers import DynamicCache
    if caps is not None and (caps.window_as_full or caps.window_mask):
        return DynamicCache()
    return DynamicCache(config=lm.model.config)


def fork_cache(cache, rows: torch.Tensor | None = None, expand: int | None = None):
    """An independent cache: all rows, the rows ``rows`` (index tensor, repeats allowed), or
    the single row expanded to ``expand`` rows. Plain layers share ``cache``'s tensors (their
    updates allocate new ones); reserved layers (:func:`reserve`) get their own buffers, since
    they are written in place."""
    new = copy.copy(cache)
    new.layers = []
    for layer in cache.layers:
        if isinstance(layer, _Buffered):
            new.layers.append(layer.select(rows) if rows is not None else layer.clone())
            continue
        lay = copy.copy(layer)
        keys = getattr(lay, "keys", None)
        if isinstance(keys, torch.Tensor) and keys.numel():
            if rows is not None:
                idx = rows.to(keys.device)
                lay.keys, lay.values = keys.index_select(0, idx), lay.values.index_select(0, idx)
            elif expand is not None:
                lay.keys = keys.expand(expand, -1, -1, -1)
                lay.values = lay.values.expand(expand, -1, -1, -1)
        new.layers.append(lay)
    return new


def _dynamic_layer_class():
    from transformers.cache_utils import DynamicLayer
    return DynamicLayer


class _Buffered:
    """Row selection and copying for cache layers whose states live in buffers ``_k``/``_v``
    (written in place) exposed through views (``_views``)."""

    def select(self, rows: torch.Tensor):
        """A copy holding the rows ``rows`` (index tensor, repeats allowed) of the buffers."""
        idx = rows.to(self._k.device)
        out = copy.copy(self)
        out._k, out._v = self._k.index_select(0, idx), self._v.index_select(0, idx)
        out._views()
        return out

    def clone(self):
        out = copy.copy(self)
        out._k, out._v = self._k.clone(), self._v.clone()
        out._views()
        return out

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._k, self._v = self._k.repeat_interleave(repeats, 0), self._v.repeat_interleave(repeats, 0)
        self._views()

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._k, self._v = self._k[indices, ...], self._v[indices, ...]
        self._views()

    def move_rows(self, dst: torch.Tensor, src: torch.Tensor, m: int) -> None:
        """In place: rows ``src`` overwrite rows ``dst`` (disjoint), then the first ``m`` rows
        are kept (views of the same buffers: nothing but the moved rows is copied)."""
        if len(dst):
            d, s = dst.to(self._k.device), src.to(self._k.device)
            self._k.index_copy_(0, d, self._k.index_select(0, s))
            self._v.index_copy_(0, d, self._v.index_select(0, s))
        self._k, self._v = self._k[:m], self._v[:m]
        self._views()


class ReservedLayer(_Buffered, _dynamic_layer_class()):
    """A full-attention cache layer whose keys/values live in buffers with room for
    ``capacity`` positions: :meth:`update` writes the new states in place and returns views,
    instead of concatenating (reallocating and copying) the whole cache at every decode step,
    which dominates CPU decoding of long prompts. Outgrowing the buffer doubles it."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, capacity: int,
                 rows: torch.Tensor | None = None):
        super().__init__()
        if rows is not None:  # only these rows (one layer's rows copied at a time)
            idx = rows.to(keys.device)
            keys, values = keys.index_select(0, idx), values.index_select(0, idx)
        n = keys.shape[-2]
        cap = max(int(capacity), n)
        self._k = keys.new_empty((*keys.shape[:2], cap, keys.shape[-1]))
        self._v = values.new_empty((*values.shape[:2], cap, values.shape[-1]))
        self._k[:, :, :n].copy_(keys)
        self._v[:, :, :n].copy_(values)
        self._n = n
        self.device = keys.device
        self.is_initialized = True
        self._views()

    def _views(self) -> None:
        self.keys, self.values = self._k[:, :, :self._n], self._v[:, :, :self._n]

    _ring: int | None = None  # ring mode: writes past the capacity wrap to this column
    _w: int = 0               # ring mode: the next column written

    def update(self, key_states, value_states, *args, **kwargs):
        q = key_states.shape[-2]
        if self._ring is not None:  # ring mode (:func:`ring`): write at _w, wrap at the end
            w = self._w if self._w + q <= self._k.shape[-2] else self._ring
            if w + q > self._k.shape[-2]:
                raise RuntimeError("a ring cache layer got more columns than its ring holds")
            self._k[:, :, w:w + q].copy_(key_states)
            self._v[:, :, w:w + q].copy_(value_states)
            self._w, self._n = w + q, max(self._n, w + q)
            self._views()
            return self.keys, self.values
        n = self._n
        if n + q > self._k.shape[-2]:
            grown = ReservedLayer(self.keys, self.values, 2 * (n + q))
            self._k, self._v = grown._k, grown._v
        self._k[:, :, n:n + q].copy_(key_states)
        self._v[:, :, n:n + q].copy_(value_states)
        self._n = n + q
        self._views()
        return self.keys, self.values

    def write_rows(self, rows: torch.Tensor, cols: torch.Tensor, keys: torch.Tensor,
                   values: torch.Tensor) -> None:
        """In place: ``keys``/``values`` ``[len(rows), H, len(cols), D]`` into rows ``rows``
        at columns ``cols`` (a refilled row's prompt, :func:`.decode.decode_continuous`)."""
        r, c = rows.to(self._k.device), cols.to(self._k.device)
        self._k[r[:, None], :, c[None, :]] = keys.permute(0, 2, 1, 3).to(self._k.dtype)
        self._v[r[:, None], :, c[None, :]] = values.permute(0, 2, 1, 3).to(self._v.dtype)


    def crop(self, tokens_to_remove: int) -> None:
        super().crop(tokens_to_remove)
        self._n = self.keys.shape[-2]
        self._views()



def _sliding_layer_class():
    from transformers.cache_utils import DynamicSlidingWindowLayer
    return DynamicSlidingWindowLayer


class ReservedSlidingLayer(_Buffered, _sliding_layer_class()):
    """A sliding-window cache layer (keeps the last ``window - 1`` positions) whose states live
    in a buffer with room for ``extra`` positions beyond the window: :meth:`update` writes in
    place and returns a view instead of concatenating and re-slicing the window every step.
    When the buffer is full, the last ``window - 1`` positions move to its front. Returns the
    same states as the plain layer and keeps its ``cumulative_length`` for the mask sizes."""

    def __init__(self, layer, extra: int, rows: torch.Tensor | None = None):
        super().__init__(sliding_window=layer.sliding_window)
        keys, values = layer.keys, layer.values
        if rows is not None:
            idx = rows.to(keys.device)
            keys, values = keys.index_select(0, idx), values.index_select(0, idx)
        n = keys.shape[-2]
        cap = self.sliding_window - 1 + max(int(extra), 1)
        self._k = keys.new_empty((*keys.shape[:2], max(cap, n), keys.shape[-1]))
        self._v = values.new_empty((*values.shape[:2], max(cap, n), values.shape[-1]))
        self._k[:, :, :n].copy_(keys)
        self._v[:, :, :n].copy_(values)
        self._n = n
        self.cumulative_length = layer.cumulative_length
        self.device = keys.device
        self.is_initialized = True
        self._views()

    def _kept(self) -> int:
        return min(self._n, self.sliding_window - 1)

    def _views(self) -> None:
        lo = self._n - self._kept()
        self.keys, self.values = self._k[:, :, lo:self._n], self._v[:, :, lo:self._n]

    def update(self, key_states, value_states, *args, **kwargs):
        q = key_states.shape[-2]
        kept = self._kept()
        if self._n + q > self._k.shape[-2]:  # full: keep the window, drop what it left behind
            lo = self._n - kept
            if kept + q > self._k.shape[-2]:
                grow = (*self._k.shape[:2], 2 * (kept + q), self._k.shape[-1])
                k, v = self._k.new_empty(grow), self._v.new_empty(grow)
            else:
                k, v = self._k, self._v
            k[:, :, :kept] = self._k[:, :, lo:self._n].clone()
            v[:, :, :kept] = self._v[:, :, lo:self._n].clone()
            self._k, self._v, self._n = k, v, kept
        n = self._n
        self._k[:, :, n:n + q].copy_(key_states)
        self._v[:, :, n:n + q].copy_(value_states)
        self._n = n + q
        self.cumulative_length += q
        full = (self._k[:, :, n - kept:n + q], self._v[:, :, n - kept:n + q])
        self._views()
        return full


    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("ReservedSlidingLayer does not support crop")



def reserve(cache, extra: int, rows: torch.Tensor | None = None):
    """``cache`` with every plain full-attention layer replaced by a :class:`ReservedLayer`
    holding room for ``extra`` more positions, and every plain sliding-window layer by a
    :class:`ReservedSlidingLayer` (other layer kinds are kept as they are). Copies the cached
    states once; with ``rows`` (index tensor) only those rows, so dropping rows before the
    first decode step costs no second copy."""
    dynamic, sliding = _dynamic_layer_class(), _sliding_layer_class()
    new = copy.copy(cache)
    new.layers = []
    for layer in cache.layers:
        keys = getattr(layer, "keys", None)
        filled = isinstance(keys, torch.Tensor) and keys.numel()
        if type(layer) is dynamic and filled:
            new.layers.append(ReservedLayer(keys, layer.values, keys.shape[-2] + extra, rows=rows))
        elif type(layer) is sliding and filled and not layer.record_past:
            new.layers.append(ReservedSlidingLayer(layer, extra, rows=rows))
        elif rows is not None:
            new.layers.append(fork_cache(_one_layer(layer), rows=rows).layers[0])
        else:
            new.layers.append(layer)
    return new


def ring(cache, start: int) -> bool:
    """Switch every layer of a reserved ``cache`` to ring mode: once its buffer is full, the
    next columns are written from column ``start`` on again (a continuous batch's stream
    columns, :func:`.decode.decode_continuous`; the caller masks what each row may see).
    False (nothing changed) where a layer is not a :class:`ReservedLayer`."""
    if not all(type(layer) is ReservedLayer for layer in cache.layers):
        return False
    for layer in cache.layers:
        layer._ring, layer._w = int(start), layer._n
    return True


class _one_layer:  # a cache-like holder of one layer, for fork_cache
    def __init__(self, layer):
        self.layers = [layer]


def drop_rows(cache, keep: list[int]) -> list[int]:
    """Keep the rows ``keep`` (ascending) of a decoding cache, in place: kept rows move into the
    holes of dropped ones and every layer's buffers are cut to ``len(keep)`` rows as views, so
    memory does not double as with :func:`fork_cache`. Returns the new order (row ``r`` holds
    old row ``order[r]``); the caller reorders its per-row state the same way. Layers not
    written in place are row-selected (copied)."""
    m = len(keep)
    kept = set(keep)
    holes = [i for i in range(m) if i not in kept]
    movers = [i for i in keep if i >= m]
    order = list(range(m))
    for h, v in zip(holes, movers):
        order[h] = v
    dst, src = torch.tensor(holes, dtype=torch.long), torch.tensor(movers, dtype=torch.long)
    sel = torch.tensor(order, dtype=torch.long)
    for i, layer in enumerate(cache.layers):
        if isinstance(layer, _Buffered):
            layer.move_rows(dst, src, m)
            continue
        keys = getattr(layer, "keys", None)
        if isinstance(keys, torch.Tensor) and keys.numel():
            cache.layers[i] = fork_cache(_one_layer(layer), rows=sel).layers[0]
    return order
