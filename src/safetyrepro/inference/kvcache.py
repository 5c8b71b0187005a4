"""Forward passes with an explicit KV cache: shared-prefix prefill, batch prefill, forking.

Cache handling. A :class:`transformers.DynamicCache` (built from the model config, so sliding
window layers such as Gemma-3's get their proper layer type) holds keys/values of shape
``[batch, heads, seq, head_dim]`` per layer. Its layers never write into their tensors in
place: ``update`` concatenates and rebinds. So a cache is *forked* by shallow-copying its layer
objects, optionally indexing/expanding the batch dimension; the fork and the original then
evolve independently while sharing the already computed tensors (no copy of the prefix).

Shared prefix. All prompts of a cell usually start with the same tokens (system text, few-shot
exemplars, template instructions). :func:`build_prefix` finds the longest token prefix common
to all sequences of a call, runs it ONCE with batch size 1, and every batch then starts from a
fork of that cache expanded to its batch size. Each batch's suffixes are left-padded, so a row
looks like ``[prefix][pads][suffix]``; padding is masked and position ids count real tokens
only, so the model sees exactly the positions of the unpadded prompt. Results equal the
no-prefix computation up to floating-point reassociation (exact token equality is checked in
fp32 by the tests). On sliding-window layers, padding occupies window slots (as it does in any
left-padded batch), which can only matter for prompts longer than the window (512 for Gemma-3).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from .encoding import common_prefix_len

MIN_PREFIX = 8  # shorter shared prefixes are not worth a separate forward


def new_cache(lm):
    from transformers import DynamicCache
    return DynamicCache(config=lm.model.config)


def forward(lm, input_ids: torch.Tensor, attention_mask: torch.Tensor,
            position_ids: torch.Tensor, cache, logits_to_keep: int = 0) -> torch.Tensor:
    """One forward pass extending ``cache`` in place; returns the logits (kept positions)."""
    out = lm.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                   use_cache=True, logits_to_keep=logits_to_keep, **{lm.cache_kwarg: cache})
    return out.logits


def positions(mask: torch.Tensor, last: int) -> torch.Tensor:
    """Position ids of the last ``last`` columns of a 0/1 mask: real tokens count 0, 1, 2, ...;
    padded slots get 1 (ignored; the same convention as transformers' generate)."""
    pos = mask.long().cumsum(-1) - 1
    pos = pos.masked_fill(mask == 0, 1)
    return pos[:, -last:]


def fork_cache(cache, rows: torch.Tensor | None = None, expand: int | None = None):
    """An independent cache sharing ``cache``'s tensors: all rows, the rows ``rows`` (index
    tensor, repeats allowed), or the single row expanded to ``expand`` rows."""
    new = copy.copy(cache)
    new.layers = []
    for layer in cache.layers:
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


@dataclass
class Prefix:
    ids: list[int]
    cache: object | None  # cache of ``ids`` for batch size 1; None when there is no prefix

    def __len__(self) -> int:
        return len(self.ids)


def build_prefix(lm, seqs: list[list[int]], *, enabled: bool = True) -> Prefix:
    """Prefill the token prefix shared by all ``seqs`` once (see the module docstring). Every
    sequence keeps at least one token of its own after the prefix."""
    if not enabled or len(seqs) < 2:
        return Prefix([], None)
    n = min(common_prefix_len(seqs), min(len(s) for s in seqs) - 1)
    if n < MIN_PREFIX:
        return Prefix([], None)
    ids = seqs[0][:n]
    dev = lm.device
    inp = torch.tensor([ids], dtype=torch.long, device=dev)
    mask = torch.ones_like(inp)
    cache = new_cache(lm)
    forward(lm, inp, mask, positions(mask, n), cache, logits_to_keep=1)
    return Prefix(ids, cache)


def prefill(lm, prefix: Prefix, seqs: list[list[int]]):
    """Run ``seqs`` (each starting with ``prefix.ids``) as one left-padded batch on top of the
    prefix cache. Returns ``(cache, mask, last_logits)``: the batch cache, the 0/1 attention
    mask over all cached positions ``[B, P + S]`` and the float32 logits of each row's last
    token ``[B, V]``."""
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
    mask = torch.cat([torch.ones((len(seqs), p), dtype=torch.long), smask], dim=1).to(dev)
    inp = inp.to(dev)
    cache = fork_cache(prefix.cache, expand=len(seqs)) if p else new_cache(lm)
    logits = forward(lm, inp, mask, positions(mask, width), cache, logits_to_keep=1)
    return cache, mask, logits[:, -1, :].float()
