"""Prefill: forward passes over prompts with an explicit KV cache.

The token prefix shared by a call's prompts is run once (:func:`build_prefix`); batches
left-pad their suffixes (``[prefix][pads][suffix]``, padding masked, position ids counting real
tokens). Where the engine's attention runs (:attr:`.capabilities.Capabilities.detached_prefix`)
the prefix stays out of the batch caches (:attr:`Prefix.detached`, :mod:`.attention`). Where
the model takes an arbitrary 4D mask, a batch's suffixes run packed without padding and are
gathered into the same layout (:func:`prefill_packed`). All layouts give the unpadded
computation's results up to summation order (tested in fp32); :class:`.store.PrefillStore`
keeps prefills across calls.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .attention import shared_prefix
from .capabilities import Capabilities
from .cache import fork_cache, new_cache
from .encoding import common_prefix_len
from .store import PrefillStore, _nbytes

MIN_PREFIX = 8  # shorter shared prefixes are not worth a separate forward


def forward(lm, input_ids: torch.Tensor, attention_mask: torch.Tensor,
            position_ids: torch.Tensor, cache, logits_to_keep: int = 0,
            prefix: "Prefix | None" = None,
            select: tuple[torch.Tensor, torch.Tensor] | None = None,
            ffn_selected_only: bool = False) -> torch.Tensor:
    """One forward pass extending ``cache`` in place; returns the logits (kept positions).
    ``attention_mask``: 2D 0/1, 4D, or one 4D mask per layer kind
    (:func:`.packing.model_mask`).

    With a detached ``prefix``, ``cache`` and ``attention_mask`` hold the rows' own columns and
    every query also attends to the prefix (:mod:`.attention`). ``select = (rows, cols)``:
    logits only at those positions, ``[len(rows), V]``, equal to ``forward(...)[rows, cols]``;
    hidden states are gathered before the output projection so unread positions are not
    projected. ``ffn_selected_only`` (the caller's promise that no selected position attends to
    an unselected one: dummy columns, :data:`.decode.SKIP_UNREAD_FFN`): the feed-forward
    blocks run on the selected positions only (:func:`_mlp_on_selected`)."""
    hooks = []
    if select is not None:
        rows, cols = select

        def gather(_module, args):
            return (args[0][rows, cols],) + tuple(args[1:])
        hooks.append(lm.model.get_output_embeddings().register_forward_pre_hook(gather))
        if ffn_selected_only and len(rows) < input_ids.numel():
            hooks += _mlp_on_selected(lm, rows * input_ids.shape[1] + cols)
    try:
        with shared_prefix(prefix if prefix is not None and prefix.detached else None):
            out = lm.model(input_ids=input_ids, attention_mask=attention_mask,
                           position_ids=position_ids, use_cache=True,
                           logits_to_keep=logits_to_keep, **{lm.cache_kwarg: cache})
    finally:
        for hook in hooks:
            hook.remove()
    return out.logits


def mlp_modules(model) -> list:
    """The feed-forward block of every decoder layer (``layer.mlp``); empty where the model's
    layers are laid out otherwise."""
    try:
        layers = model.get_decoder().layers
    except AttributeError:
        return []
    mlps = [getattr(layer, "mlp", None) for layer in layers]
    return mlps if all(m is not None for m in mlps) else []


def _mlp_on_selected(lm, flat: torch.Tensor) -> list:
    """Hooks that run every decoder layer's feed-forward block on the token positions ``flat``
    (indices into the flattened ``[B * S]`` input) only, zeros elsewhere; for positions that
    no kept position attends to, whose feed-forward output is never used."""
    shape = {}

    def pre(_module, args):
        x = args[0]
        shape["x"] = x.shape
        return (x.reshape(-1, x.shape[-1]).index_select(0, flat),) + tuple(args[1:])

    def post(_module, _args, y):
        full = y.new_zeros((shape["x"][:-1].numel(), y.shape[-1]))
        full.index_copy_(0, flat, y)
        return full.reshape(*shape["x"][:-1], y.shape[-1])

    hooks = []
    for mlp in mlp_modules(lm.model):
        hooks.append(mlp.register_forward_pre_hook(pre))
        hooks.append(mlp.register_forward_hook(post))
    return hooks


def positions(mask: torch.Tensor, last: int, offset: int = 0) -> torch.Tensor:
    """Position ids of the last ``last`` columns of a 0/1 mask: real tokens count ``offset``,
    ``offset + 1``, ... (``offset``: the length of a detached prefix the mask does not cover);
    padded slots get 1 (ignored; the same convention as transformers' generate)."""
    pos = mask.long().cumsum(-1) - 1 + offset
    pos = pos.masked_fill(mask == 0, 1)
    return pos[:, -last:]


@dataclass
class Prefix:
    """The token prefix shared by all sequences of a call, prefilled once.

    ``detached``: batch caches and masks cover only their own columns, position ids start at
    ``len(prefix)`` and :func:`forward` attends to the prefix. Otherwise each batch starts from
    a fork of :attr:`cache` expanded to its rows."""
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


def build_prefix(lm, seqs: list[list[int]], caps: Capabilities, *, enabled: bool = True,
                 store: PrefillStore | None = None) -> Prefix:
    """Prefill the token prefix shared by all ``seqs`` once (see the module docstring), laid
    out as the call's capabilities ``caps`` say. Every sequence keeps at least one token of its
    own after the prefix; none is shared where rows may not be padded after one
    (``caps.pad_after_prefix``). With a ``store``, a prefix already computed on this model is
    taken from it."""
    if not enabled or len(seqs) < 2 or not caps.pad_after_prefix:
        return Prefix([], None)
    n = min(common_prefix_len(seqs), min(len(s) for s in seqs) - 1)
    if n < MIN_PREFIX:
        return Prefix([], None)
    ids = seqs[0][:n]
    key = ("prefix", caps.detached_prefix, caps.window_as_full, caps.window_mask, tuple(ids))
    if store is not None:
        got = store.get(key)
        if got is not None:
            return got
    dev = lm.device
    inp = torch.tensor([ids], dtype=torch.long, device=dev)
    mask = torch.ones_like(inp)
    cache = new_cache(lm, caps)
    forward(lm, inp, mask, positions(mask, n), cache, logits_to_keep=1)
    prefix = Prefix(ids, cache, detached=caps.detached_prefix)
    if store is not None:
        store.put(key, prefix, _nbytes(cache))
    return prefix


def prefill(lm, prefix: Prefix, seqs: list[list[int]], caps: Capabilities, *,
            packed: bool = True, store: PrefillStore | None = None):
    """Run ``seqs`` (each starting with ``prefix.ids``) as one left-padded batch on top of the
    prefix. Returns ``(cache, mask, last_logits)``: the batch cache, the 0/1 mask over all
    cached positions ``[B, P + S]`` (``[B, S]`` for a detached prefix) and the float32 logits
    of each row's last token ``[B, V]``. ``packed`` (where ``caps.mask_4d``): no padding is
    computed (:func:`prefill_packed`); same layout either way. With a ``store``, a batch
    prefilled before is taken from it: callers must not write into the returned cache."""
    if store is not None:
        key = ("batch", len(prefix), prefix.detached, caps.window_as_full, caps.window_mask,
               packed, tuple(map(tuple, seqs)))
        got = store.get(key)
        if got is None:
            got = prefill(lm, prefix, seqs, caps, packed=packed)
            store.put(key, got, _nbytes(*got))
        return got
    # a call whose sliding layers the engine masks has no other correct batch layout
    if (packed or caps.window_mask) and len(seqs) > 1 and caps.mask_4d:
        return prefill_packed(lm, prefix, seqs, caps)
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
        mask, cache = smask.to(dev), new_cache(lm, caps)
    else:
        mask = torch.cat([torch.ones((len(seqs), p), dtype=torch.long), smask], dim=1).to(dev)
        cache = fork_cache(prefix.cache, expand=len(seqs)) if p else new_cache(lm, caps)
    logits = forward(lm, inp, mask, positions(mask, width, prefix.offset), cache,
                     logits_to_keep=1, prefix=prefix)
    return cache, mask, logits[:, -1, :].float()


def prefill_packed(lm, prefix: Prefix, seqs: list[list[int]], caps: Capabilities):
    """:func:`prefill` without padding: the suffixes are packed first-fit-decreasing into
    rows (:func:`.packing.pack_rows`) under a block-diagonal causal mask
    (each suffix sees the prefix and itself only, with its own position ids), run in one
    forward with logits only at each suffix's last token, and the resulting keys/values are
    then gathered into the usual left-padded per-sequence layout ``[prefix][pads][suffix]``
    for decoding. Same contract and results (up to float reassociation) as the padded path."""
    from .packing import model_mask, pack_rows, packed_key_positions

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
        allowed, cache = new, new_cache(lm, caps)
    attn = model_mask(lm, allowed, caps=caps, qpos=pos, kpos=packed_key_positions(pos, q),
                      device=dev)
    logits = forward(lm, inp.to(dev), attn, pos.to(dev), cache,
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
