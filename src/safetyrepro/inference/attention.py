"""Attention for the CPU engine: a batch attends to its shared prefix without copying it.

All prompts of a cell usually start with the same tokens (system text, few-shot exemplars,
instructions: the call's shared prefix, :func:`.prefill.build_prefix`), often most of each
prompt. Left to transformers, every row of a batch would hold its own copy of the prefix's
keys and values, copied when the batch is prefilled, re-laid out and reserved for decoding, and
read once per row at every decode step; and its ``sdpa`` function, given a mask and several
query positions (packed prefill, packed scoring, a decode group's stream columns), first
expands keys and values to one copy per query head (grouped-query attention: SmolLM2 has 9
query heads on 3 key/value heads, Qwen2.5-0.5B 14 on 2). On a CPU those copies, not the
arithmetic, were most of the decode time of a few-shot cell.

:func:`engine_attention` (registered as the attention implementation :data:`NAME`) lets the
engine keep the prefix OUT of the batch caches. Inside :func:`shared_prefix` ``(prefix)``
every query of a forward pass attends to the prefix's keys/values (stored once, batch size 1)
followed by the row's own cached columns under the row's mask; attention splits into

* the prefix part: one matrix product per key/value head for all rows, query heads and query
  positions at once (``[rows * groups * Q, D] x [D, P]``), reading the prefix once (from
  :data:`FUSED_MIN_SCORES` scores on, torch's fused CPU kernel computes it without writing
  the scores out);
* the own part: each row's columns under its mask (None: causal), query heads folded per
  key/value head (``[B, Hq, Q, D] -> [B, Hkv, groups * Q, D]``), no copies;

merged by their log-sum-exp (the "cascade" form of attention over a shared prefix). Scores,
softmax and weighted sums run in float32, as the fused CPU kernel accumulates them; results
equal ``sdpa`` over the prefix and the own columns written out in full up to summation order
(tests compare both, on random tensors and on the model's generations and scores). Outside
the context it is transformers' ``sdpa`` function unchanged; inside it, what it cannot
combine with a prefix (per-head masks, position biases, soft-capping) raises instead of
silently dropping the prefix.

Only for models whose layers all attend fully: sliding-window layers would need the prefix
cut to their window (:attr:`.capabilities.Capabilities.detached_prefix` decides; the engine keeps the prefix in
the batch caches otherwise). Masks are sdpa's (boolean), so code that accepts ``sdpa``
accepts :data:`NAME` too (:data:`SDPA_LIKE`).
"""

from __future__ import annotations

import contextlib
import contextvars

import torch

NAME = "sdpa_engine"
SDPA_LIKE = ("sdpa", NAME)  # implementations that take sdpa's boolean 4D masks

_SHARED = contextvars.ContextVar("safetyrepro_shared_prefix", default=None)


@contextlib.contextmanager
def shared_prefix(prefix):
    """Within this context every query of a forward pass also attends to ``prefix`` (an object
    with ``kv(layer_idx) -> (keys, values)``, each ``[kv heads, P, head dim]``: a
    :class:`.prefill.Prefix`), which precedes the batch's own cached columns; None: off."""
    token = _SHARED.set(prefix)
    try:
        yield
    finally:
        _SHARED.reset(token)


def _fold_mask(mask: torch.Tensor, groups: int, q: int) -> torch.Tensor:
    """``[mb, 1, Q, K]`` -> ``[mb, 1, groups * Q, K]`` (the same rows for each folded head)."""
    if q == 1:
        return mask  # broadcasts over the folded axis
    mb, _, _, k = mask.shape
    return mask[:, :, None].expand(mb, 1, groups, q, k).reshape(mb, 1, groups * q, k)


def _flash_cpu():
    """torch's fused CPU attention kernel, which also returns each query's log-sum-exp (None
    where this torch lacks it)."""
    op = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    return op.default if op is not None else None


# From this many prefix scores (kv heads x queries x prefix columns; 16 MB of float32) the
# prefix part runs in the fused CPU kernel. A packed prefill's prefix scores are large and
# written out cost more memory traffic than arithmetic: 100 five-shot TruthfulQA prompts on
# SmolLM2 have [3, 25725, 599] per layer (185 MB), streamed through memory by the product, the
# scale, the max, the exp, the sum and the second product (benchmark 2, RESULTS.md). Decode
# steps (one query per row or a few stream columns) stay below it and keep the plain products.
FUSED_MIN_SCORES = 1 << 22


def _cascade(query, key, value, mask, kp, vp, groups: int, scale: float) -> torch.Tensor:
    """Attention of ``query`` ``[B, Hq, Q, D]`` over the shared prefix ``kp``/``vp``
    ``[Hkv, P, D]`` (visible to every query) followed by each row's own ``key``/``value``
    ``[B, Hkv, K, D]`` under ``mask`` ``[mb, 1, Q, K]`` (None: causal, aligned to the last
    column). Returns ``[B, Hq, Q, D]`` in float32."""
    b, hq, q, d = query.shape
    hkv = key.shape[1]
    gq = groups * q
    qf = query.float().reshape(b, hkv, gq, d)
    # the prefix: one product per key/value head for every row, head and position at once
    qp = qf.transpose(0, 1).reshape(hkv, b * gq, d)
    flash = _flash_cpu() if query.device.type == "cpu" else None
    if flash is not None and hkv * b * gq * kp.shape[1] >= FUSED_MIN_SCORES:
        # the fused kernel tiles the scores instead of writing them out; it returns the
        # normalised output and each query's log-sum-exp, i.e. op / lp and mp + log(lp)
        op, lse = flash(qp[None], kp.float()[None], vp.float()[None], scale=scale)
        op, mp = op[0], lse[0][..., None]                                # [Hkv, B*GQ, D|1]
        lp = torch.ones_like(mp)
    else:
        sp = torch.bmm(qp, kp.transpose(1, 2))
        sp.mul_(scale)                                                   # [Hkv, B*GQ, P]
        mp = sp.amax(dim=-1, keepdim=True)
        ep = sp.sub_(mp).exp_()
        lp = ep.sum(dim=-1, keepdim=True)
        op = torch.bmm(ep, vp)                                           # [Hkv, B*GQ, D]

    def per_row(t):  # [Hkv, B*GQ, X] -> [B, Hkv, GQ, X]
        return t.reshape(hkv, b, gq, t.shape[-1]).transpose(0, 1)

    mp, lp, op = per_row(mp), per_row(lp), per_row(op)
    # the rows' own columns
    ko, vo = key.float(), value.float()
    so = torch.matmul(qf, ko.transpose(-1, -2)).mul_(scale)              # [B, Hkv, GQ, K]
    k = key.shape[2]
    if mask is None and q > 1:
        mask = torch.ones((q, k), dtype=torch.bool, device=so.device).tril(k - q)[None, None]
    if mask is not None:
        m = _fold_mask(mask, groups, q)
        if m.dtype == torch.bool:
            so.masked_fill_(~m, float("-inf"))
        else:
            so.add_(m.float())
    top = torch.maximum(mp, so.amax(dim=-1, keepdim=True))              # finite: mp is
    eo = so.sub_(top).exp_()
    w = (mp - top).exp_()
    out = (op * w + torch.matmul(eo, vo)) / (lp * w + eo.sum(dim=-1, keepdim=True))
    return out.reshape(b, hq, q, d)


def engine_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, dropout: float = 0.0,
                     scaling: float | None = None, is_causal: bool | None = None,
                     **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: ``query`` ``[B, Hq, Q, D]``, ``key`` /
    ``value`` ``[B, Hkv, K, D]``, ``attention_mask`` ``[B or 1, 1, Q, K]`` (boolean: may
    attend; or additive float) or None; returns ``([B, Q, Hq, D], None)``."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    prefix = _SHARED.get()
    if prefix is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    b, hq, q, d = query.shape
    hkv = key.shape[1]
    groups = hq // hkv
    unsupported = [name for name, bad in (
        ("a per-head mask", attention_mask is not None and attention_mask.shape[1] != 1),
        ("uneven head groups", hq != hkv * groups),
        ("a position bias", kwargs.get("position_bias") is not None),
        ("logit soft-capping", kwargs.get("softcap") is not None),
        ("dropout in training", bool(dropout) and module.training)) if bad]
    if unsupported:
        raise RuntimeError(f"{NAME}: a shared prefix cannot be combined with "
                           f"{', '.join(unsupported)} (layer {getattr(module, 'layer_idx', '?')})")
    kp, vp = prefix.kv(module.layer_idx)
    scale = scaling if scaling is not None else d ** -0.5
    out = _cascade(query, key, value, attention_mask, kp, vp, groups, scale).to(query.dtype)
    return out.transpose(1, 2).contiguous(), None


def register() -> None:
    """Register :data:`NAME` with transformers' attention and mask interfaces (idempotent)."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if NAME not in ALL_ATTENTION_FUNCTIONS.valid_keys():
        ALL_ATTENTION_FUNCTIONS.register(NAME, engine_attention)
        ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)


def attn_implementation(model) -> str | None:
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return getattr(config, "_attn_implementation", None)


def use_engine_attention(model) -> bool:
    """Switch ``model`` from ``sdpa`` to :data:`NAME`; returns whether it did (models loaded
    with another implementation, e.g. eager, keep theirs)."""
    if attn_implementation(model) != "sdpa":
        return False
    register()
    model.set_attn_implementation(NAME)
    return attn_implementation(model) == NAME
