"""Forward passes with an explicit KV cache: shared-prefix prefill, batch prefill, forking.

Cache handling. A :class:`transformers.DynamicCache` (built from the model config, so sliding
window layers such as Gemma-3's get their proper layer type) holds keys/values of shape
``[batch, heads, seq, head_dim]`` per layer. Its layers never write into their tensors in
place: ``update`` concatenates and rebinds. So a cache is *forked* by shallow-copying its layer
objects, optionally indexing/expanding the batch dimension; the fork and the original then
evolve independently while sharing the already computed tensors (no copy of the prefix).
Decoding switches a batch's cache to :class:`ReservedLayer` buffers (:func:`reserve`) that
are written in place, because concatenating the whole cache at every step reallocates and
copies it (the dominant cost of CPU decoding under memory pressure); forks of reserved layers
copy their buffers.

Packed prefill. Where the model allows an arbitrary 4D mask and has no sliding-window layers
(:func:`packed_prefill_supported`), :func:`prefill` runs a batch's suffixes packed into dense
rows under a block-diagonal mask (no padding computed) and then gathers the keys/values into
the per-sequence ``[prefix][pads][suffix]`` layout described below (:func:`prefill_packed`).

Shared prefix. All prompts of a cell usually start with the same tokens (system text, few-shot
exemplars, template instructions). :func:`build_prefix` finds the longest token prefix common
to all sequences of a call, runs it ONCE with batch size 1, and every batch then starts from a
fork of that cache expanded to its batch size. Each batch's suffixes are left-padded, so a row
looks like ``[prefix][pads][suffix]``; padding is masked and position ids count real tokens
only, so the model sees exactly the positions of the unpadded prompt. Results equal the
no-prefix computation up to floating-point reassociation (exact token equality is checked in
fp32 by the tests). On sliding-window layers, padding occupies window slots (as it does in any
left-padded batch), which can only matter for prompts longer than the window (512 for Gemma-3).

Detached prefix. Where the model runs the engine's attention on full-attention layers only
(:func:`shares_prefix`: the embedded SmolLM2 and Qwen on a CPU), the prefix is not copied
into the batches at all: a batch cache and its mask cover the row's own columns
``[pads][suffix][generated]``, position ids start at the prefix length (:attr:`Prefix.offset`),
and every :func:`forward` given the :class:`Prefix` attends to its keys/values, stored once
(:mod:`.attention`). Same results up to summation order (tested against the copied layout).

Sliding windows as full attention. A sliding-window layer (Gemma-3: 512 positions) attends
exactly like a full-attention layer as long as no query is a window or more past a key. Inside
:func:`window_as_full` ``(lm, max_positions)`` — entered by a generation call whose prompts
plus new tokens stay within the window — caches are built with full layers only, so packed
prefill, the detached prefix and a sampled config's seed columns (whose cache rows hold more
columns than positions) work on such models too; outside it, or for longer calls, the sliding
layers keep their own caches.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
from dataclasses import dataclass, field

import torch

from .attention import NAME as ATTENTION
from .attention import attn_implementation, shared_prefix
from .encoding import common_prefix_len

MIN_PREFIX = 8  # shorter shared prefixes are not worth a separate forward


_WINDOW_AS_FULL = contextvars.ContextVar("safetyrepro_window_as_full", default=None)


@contextlib.contextmanager
def window_as_full(lm, max_positions: int):
    """Within this context, treat ``lm``'s sliding-window layers as full attention if every
    position of the work inside stays below the window (``max_positions <= window``: prompt
    length plus new tokens); yields whether it does. Only for models whose other layers attend
    fully and whose attention takes 4D masks (:func:`.packing.packed_supported`)."""
    from .packing import packed_supported, sliding_window

    window = sliding_window(lm.model.config)
    on = window is not None and 0 < int(max_positions) <= window and packed_supported(lm, window)
    token = _WINDOW_AS_FULL.set(lm.model if on else None)
    try:
        yield on
    finally:
        _WINDOW_AS_FULL.reset(token)


def _windows_full(lm) -> bool:
    return _WINDOW_AS_FULL.get() is lm.model


def new_cache(lm):
    """An empty cache for ``lm``: layer kinds from its config (sliding-window layers keep their
    window), or full layers only inside :func:`window_as_full`."""
    from transformers import DynamicCache
    if _windows_full(lm):
        return DynamicCache()
    return DynamicCache(config=lm.model.config)


def forward(lm, input_ids: torch.Tensor, attention_mask: torch.Tensor,
            position_ids: torch.Tensor, cache, logits_to_keep: int = 0,
            prefix: "Prefix | None" = None,
            select: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """One forward pass extending ``cache`` in place; returns the logits (kept positions).

    With a *detached* ``prefix`` (:attr:`Prefix.detached`), ``cache`` and ``attention_mask``
    hold the rows' own columns only and every query also attends to the prefix, which the
    engine's attention reads once for the whole batch (:mod:`.attention`).

    ``select = (rows, cols)``: logits only at the positions ``(rows[i], cols[i])``, returned
    as ``[len(rows), V]``; the final hidden states are gathered before the output projection
    (which is most of a decode step's work for 150k+ vocabularies), so positions nobody reads
    are not projected. Whatever the model applies after the projection (Gemma's logit
    soft-capping) still applies; the selected logits equal ``forward(...)[rows, cols]``."""
    hook = None
    if select is not None:
        rows, cols = select

        def gather(_module, args):
            return (args[0][rows, cols],) + tuple(args[1:])
        hook = lm.model.get_output_embeddings().register_forward_pre_hook(gather)
    try:
        with shared_prefix(prefix if prefix is not None and prefix.detached else None):
            out = lm.model(input_ids=input_ids, attention_mask=attention_mask,
                           position_ids=position_ids, use_cache=True,
                           logits_to_keep=logits_to_keep, **{lm.cache_kwarg: cache})
    finally:
        if hook is not None:
            hook.remove()
    return out.logits


def shares_prefix(lm) -> bool:
    """Whether ``lm`` runs the engine's attention (:data:`.attention.NAME`) on layers that all
    attend fully (sliding-window layers: inside :func:`window_as_full`), so a batch can attend
    to a shared prefix kept outside its cache."""
    return attn_implementation(lm.model) == ATTENTION and packed_prefill_supported(lm)


def positions(mask: torch.Tensor, last: int, offset: int = 0) -> torch.Tensor:
    """Position ids of the last ``last`` columns of a 0/1 mask: real tokens count ``offset``,
    ``offset + 1``, ... (``offset``: the length of a detached prefix the mask does not cover);
    padded slots get 1 (ignored; the same convention as transformers' generate)."""
    pos = mask.long().cumsum(-1) - 1 + offset
    pos = pos.masked_fill(mask == 0, 1)
    return pos[:, -last:]


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

    def update(self, key_states, value_states, *args, **kwargs):
        n, q = self._n, key_states.shape[-2]
        if n + q > self._k.shape[-2]:
            grown = ReservedLayer(self.keys, self.values, 2 * (n + q))
            self._k, self._v = grown._k, grown._v
        self._k[:, :, n:n + q].copy_(key_states)
        self._v[:, :, n:n + q].copy_(value_states)
        self._n = n + q
        self._views()
        return self.keys, self.values


    def crop(self, tokens_to_remove: int) -> None:
        super().crop(tokens_to_remove)
        self._n = self.keys.shape[-2]
        self._views()



def _sliding_layer_class():
    from transformers.cache_utils import DynamicSlidingWindowLayer
    return DynamicSlidingWindowLayer


class ReservedSlidingLayer(_Buffered, _sliding_layer_class()):
    """A sliding-window cache layer (``DynamicSlidingWindowLayer``: keeps the last
    ``window - 1`` positions; an update returns those plus the new ones) whose states live in a
    buffer with room for ``extra`` positions beyond the window: :meth:`update` writes in place
    and returns a view, instead of concatenating and re-slicing the whole window at every
    decode step (measured: 35% of a sampled Gemma-3 cell). Old positions stay in the buffer
    until it is full, then the last ``window - 1`` move to its front (once per ``extra``
    steps). Returns the same states in the same order as the plain layer, and keeps its
    ``cumulative_length`` for the mask sizes."""

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


class _one_layer:  # a cache-like holder of one layer, for fork_cache
    def __init__(self, layer):
        self.layers = [layer]


def drop_rows(cache, keep: list[int]) -> list[int]:
    """Keep the rows ``keep`` (ascending positions) of a decoding cache, IN PLACE: the rows
    past ``len(keep)`` that are kept move into the holes the dropped rows leave among the
    first ``len(keep)``, and every layer's buffers are then cut to their first ``len(keep)``
    rows (views: a reserved cache's buffers are not copied, so memory does not double while
    finished rows leave the batch, as it does with :func:`fork_cache`). Returns the new row
    order: row ``r`` now holds what was row ``order[r]``; the caller reorders its own per-row
    state (mask, tokens, sequence ids) the same way. Rows do not interact in a forward pass,
    so the order changes what each row computes only by the summation order of batched
    kernels (tested equal in fp32). Layers not written in place are row-selected (copied)."""
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


@dataclass
class Prefix:
    """The token prefix shared by all sequences of a call, prefilled once.

    ``detached``: batches do not copy the prefix into their caches; their caches and masks
    cover their own columns only (``[pads][suffix]...``), position ids start at ``len(prefix)``
    and every forward attends to the prefix through :func:`forward` (models where
    :func:`shares_prefix`). Otherwise each batch starts from a fork of :attr:`cache` expanded
    to its rows (``[prefix][pads][suffix]``)."""
    ids: list[int]
    cache: object | None  # cache of ``ids`` for batch size 1; None when there is no prefix
    detached: bool = False
    _f32: dict = field(default_factory=dict, repr=False)

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def offset(self) -> int:
        """Columns of the prefix that batch caches and masks leave out."""
        return len(self.ids) if self.detached else 0

    def kv(self, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``layer_idx``'s prefix keys and values ``[kv heads, len, head dim]`` in float32
        (what the engine's attention reads; converted once per layer)."""
        got = self._f32.get(layer_idx)
        if got is None:
            layer = self.cache.layers[layer_idx]
            got = self._f32[layer_idx] = (layer.keys[0].float(), layer.values[0].float())
        return got


class PrefillStore:
    """Prefills kept across calls on one model, least recently used first out, within a byte
    budget (keys/values, masks and logits counted).

    The cells of a (template, shots) pair under greedy, T=0.3 and T=0.7 decoding render the
    SAME prompts, and free-form and logprob cells often share the few-shot prefix; a store
    passed to :func:`build_prefix` and :func:`prefill` (the worker passes one per model, see
    :mod:`safetyrepro.cells`) computes each distinct prefix and each distinct batch prefill
    once. Entries are never written to after they are stored (decoding forks or reserves
    fresh buffers before its first step), and a prefill is a deterministic function of the
    model and the token ids, so a hit returns exactly what recomputing would."""

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


def build_prefix(lm, seqs: list[list[int]], *, enabled: bool = True,
                 store: PrefillStore | None = None) -> Prefix:
    """Prefill the token prefix shared by all ``seqs`` once (see the module docstring). Every
    sequence keeps at least one token of its own after the prefix. With a ``store``, a prefix
    already computed on this model is taken from it."""
    if not enabled or len(seqs) < 2:
        return Prefix([], None)
    n = min(common_prefix_len(seqs), min(len(s) for s in seqs) - 1)
    if n < MIN_PREFIX:
        return Prefix([], None)
    ids = seqs[0][:n]
    key = ("prefix", shares_prefix(lm), _windows_full(lm), tuple(ids))
    if store is not None:
        got = store.get(key)
        if got is not None:
            return got
    dev = lm.device
    inp = torch.tensor([ids], dtype=torch.long, device=dev)
    mask = torch.ones_like(inp)
    cache = new_cache(lm)
    forward(lm, inp, mask, positions(mask, n), cache, logits_to_keep=1)
    prefix = Prefix(ids, cache, detached=shares_prefix(lm))
    if store is not None:
        store.put(key, prefix, _nbytes(cache))
    return prefix


def prefill(lm, prefix: Prefix, seqs: list[list[int]], *, packed: bool = True,
            store: PrefillStore | None = None):
    """Run ``seqs`` (each starting with ``prefix.ids``) as one left-padded batch on top of the
    prefix cache. Returns ``(cache, mask, last_logits)``: the batch cache, the 0/1 attention
    mask over all cached positions ``[B, P + S]`` (``[B, S]`` for a detached prefix: the
    rows' own columns) and the float32 logits of each row's last token ``[B, V]``.

    With ``packed`` (and where :func:`packed_prefill_supported`), the suffixes are computed
    without padding (:func:`prefill_packed`); the returned cache and mask have the same layout
    either way. With a ``store``, the same batch prefilled before on this model (same token
    ids, same prefix) is taken from it; callers must not write into the returned cache."""
    if store is not None:
        key = ("batch", len(prefix), prefix.detached, _windows_full(lm), packed, tuple(map(tuple, seqs)))
        got = store.get(key)
        if got is None:
            got = prefill(lm, prefix, seqs, packed=packed)
            store.put(key, got, _nbytes(*got))
        return got
    if packed and len(seqs) > 1 and packed_prefill_supported(lm):
        return prefill_packed(lm, prefix, seqs)
    dev = lm.device
    p = len(prefix)
    suffixes = [s[p:] for s in seqs]
    width = max(len(s) for s in suffixes)
    pad = lm.tokenizer.pad_token_id
    inp = torch.full((len(seqs), width), pad, dtype=torch.long)
    smask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(suffixes):
        if s:
            inp[i, width - len(s):] = torch.tensor(s, dtype=torch.long)
            smask[i, width - len(s):] = 1
    inp = inp.to(dev)
    if prefix.detached:
        mask, cache = smask.to(dev), new_cache(lm)
    else:
        mask = torch.cat([torch.ones((len(seqs), p), dtype=torch.long), smask], dim=1).to(dev)
        cache = fork_cache(prefix.cache, expand=len(seqs)) if p else new_cache(lm)
    logits = forward(lm, inp, mask, positions(mask, width, prefix.offset), cache,
                     logits_to_keep=1, prefix=prefix)
    return cache, mask, logits[:, -1, :].float()


def packed_prefill_supported(lm) -> bool:
    """Packed prefill needs what packed scoring needs (an attention implementation taking a
    4D mask, boolean ``logits_to_keep``) and plain per-layer caches: on sliding-window layers
    the cache keeps only the last window of the packed row, which would mix items (so only
    inside :func:`window_as_full` on models that have them)."""
    from .packing import packed_supported, sliding_window

    if not packed_supported(lm, 1):
        return False
    return sliding_window(lm.model.config) is None or _windows_full(lm)


def prefill_packed(lm, prefix: Prefix, seqs: list[list[int]]):
    """:func:`prefill` without padding: the suffixes are packed first-fit-decreasing into
    rows (:func:`.packing.pack_rows`) under a block-diagonal causal mask
    (each suffix sees the prefix and itself only, with its own position ids), run in one
    forward with logits only at each suffix's last token, and the resulting keys/values are
    then gathered into the usual left-padded per-sequence layout ``[prefix][pads][suffix]``
    for decoding. Same contract and results (up to float reassociation) as the padded path."""
    from .packing import attention_mask_4d, pack_rows

    dev = lm.device
    p = len(prefix)
    suffixes = [s[p:] for s in seqs]
    if min(len(s) for s in suffixes) < 1:
        raise ValueError("every sequence must keep at least one token after the shared prefix")
    longest = max(len(s) for s in suffixes)
    rows = pack_rows([len(s) for s in suffixes], p)
    width = max(sum(len(suffixes[i]) for i in r) for r in rows)
    n_rows = len(rows)
    inp = torch.full((n_rows, width), lm.tokenizer.pad_token_id, dtype=torch.long)
    pos = torch.zeros((n_rows, width), dtype=torch.long)
    new = torch.eye(width, dtype=torch.bool).repeat(n_rows, 1, 1)  # padding sees itself
    real = torch.zeros((n_rows, width), dtype=torch.bool)
    keep = torch.zeros((n_rows, width), dtype=torch.bool)
    where = {}
    for r, items in enumerate(rows):
        off = 0
        for i in items:
            n = len(suffixes[i])
            inp[r, off:off + n] = torch.tensor(suffixes[i], dtype=torch.long)
            pos[r, off:off + n] = torch.arange(p, p + n)
            new[r, off:off + n, off:off + n] = torch.tril(torch.ones((n, n), dtype=torch.bool))
            real[r, off:off + n] = True
            keep[r, off + n - 1] = True
            where[i] = (r, off, n)
            off += n
    q = p - prefix.offset  # prefix columns inside the batch cache (0 when detached)
    if q:
        allowed = torch.cat([real[:, :, None].expand(n_rows, width, q), new], dim=2)
        cache = fork_cache(prefix.cache, expand=n_rows)
    else:
        allowed, cache = new, new_cache(lm)
    logits = forward(lm, inp.to(dev), attention_mask_4d(lm, allowed).to(dev), pos.to(dev), cache,
                     logits_to_keep=keep.to(dev), prefix=prefix)
    if logits.dim() != 2 or logits.shape[0] != len(seqs):
        raise RuntimeError("the model ignored a boolean logits_to_keep during packed prefill")
    rank = torch.full((n_rows, width), -1, dtype=torch.long)
    rank[keep] = torch.arange(len(seqs))
    order = torch.tensor([int(rank[where[i][0], where[i][1] + where[i][2] - 1])
                          for i in range(len(seqs))], device=dev)
    last = logits.index_select(0, order).float()
    # re-layout: sequence i = [prefix columns][pads][its suffix columns of its packed row]
    row_idx = torch.tensor([where[i][0] for i in range(len(seqs))], dtype=torch.long)
    col_idx = torch.zeros((len(seqs), q + longest), dtype=torch.long)
    mask = torch.zeros((len(seqs), q + longest), dtype=torch.long)
    col_idx[:, :q] = torch.arange(q)
    mask[:, :q] = 1
    for i, (r, off, n) in where.items():
        col_idx[i, q + longest - n:] = torch.arange(q + off, q + off + n)
        mask[i, q + longest - n:] = 1
    row_idx, col_idx = row_idx.to(dev), col_idx.to(dev)
    for layer in cache.layers:
        layer.keys = layer.keys[row_idx[:, None], :, col_idx, :].permute(0, 2, 1, 3).contiguous()
        layer.values = layer.values[row_idx[:, None], :, col_idx, :].permute(0, 2, 1, 3).contiguous()
    return cache, mask.to(dev), last
