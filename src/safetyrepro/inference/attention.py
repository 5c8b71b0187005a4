"""Attention for the engine: a shared prefix kept out of the batch caches, and grouped
query heads without key/value copies.

Inside :func:`shared_prefix`, :func:`engine_attention` (:data:`NAME`) lets every query attend
to the call's shared prefix (:func:`.prefill.build_prefix`), stored once, plus the row's own
cached columns, merged by log-sum-exp in float32; what it cannot combine with a prefix
(per-head masks, position biases, soft-capping) raises. Full-attention models only
(:attr:`.capabilities.Capabilities.detached_prefix`). :func:`grouped_attention` (:data:`GROUPED`)
folds each key/value head's query heads into the query axis instead of the per-head key/value
copies (``repeat_kv``) that ``sdpa`` makes under a 4D mask; torch's ``enable_gqa`` is not used,
as with a mask it leaves CUDA's fused kernels. Both equal ``sdpa`` up to summation order. A
model's ``attention`` (recorded in each shard) is ``sdpa``, :data:`GROUPED`, :data:`NAME` or
:data:`NAME_REPEAT` (``runtime.grouped_attention: false``).
"""

from __future__ import annotations

import contextlib
import contextvars

import torch

NAME = "sdpa_engine"                  # shared prefix; grouped heads without copies outside it
NAME_REPEAT = "sdpa_engine_repeat"    # shared prefix; transformers' sdpa outside it
GROUPED = "sdpa_grouped"              # grouped heads without copies, no shared prefix
ENGINE_NAMES = (NAME, NAME_REPEAT)    # implementations that can attend to a detached prefix
GROUPED_NAMES = (NAME, GROUPED)       # implementations that attend grouped heads without copies
SDPA_LIKE = ("sdpa", GROUPED, *ENGINE_NAMES)  # implementations that take sdpa's boolean 4D masks

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


def _foldable(module, query, key, attention_mask, dropout, kwargs) -> int:
    """The query heads per key/value head when :func:`grouped_attention` folds them (else 0):
    grouped heads, several queries per row, a mask shared by all heads, nothing sdpa would
    have to combine with it (position bias, soft-capping, dropout)."""
    hq, q, hkv = query.shape[1], query.shape[2], key.shape[1]
    if (hkv == hq or hq % hkv or q == 1 or attention_mask is None
            or attention_mask.dim() != 4 or attention_mask.shape[1] != 1
            or kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None
            or kwargs.get("output_attentions") or (bool(dropout) and module.training)):
        return 0
    return hq // hkv


def grouped_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0,
                      scaling: float | None = None, is_causal: bool | None = None,
                      **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' ``sdpa`` with grouped heads attended without copies of keys/values
    (module text); the same contract as :func:`engine_attention`. Where nothing is to fold
    (no grouping, one query, no mask: transformers copies nothing there) it is transformers'
    function unchanged."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = _foldable(module, query, key, attention_mask, dropout, kwargs)
    if not groups:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    b, hq, q, d = query.shape
    hkv = key.shape[1]
    # head h * groups + g reads key/value head h (repeat_kv's order): fold (g, q) per head h
    folded = query.reshape(b, hkv, groups * q, d)
    mask = _fold_mask(attention_mask, groups, q)
    out = torch.nn.functional.scaled_dot_product_attention(folded, key, value, attn_mask=mask,
                                                           scale=scaling)
    return out.reshape(b, hq, q, value.shape[-1]).transpose(1, 2).contiguous(), None


def _engine(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
            *, grouped: bool, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    prefix = _SHARED.get()
    if prefix is None:
        plain = grouped_attention if grouped else sdpa_attention_forward
        return plain(module, query, key, value, attention_mask, dropout=dropout,
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


def engine_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, dropout: float = 0.0,
                     scaling: float | None = None, is_causal: bool | None = None,
                     **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: ``query`` ``[B, Hq, Q, D]``, ``key`` /
    ``value`` ``[B, Hkv, K, D]``, ``attention_mask`` ``[B or 1, 1, Q, K]`` (boolean: may
    attend; or additive float) or None; returns ``([B, Q, Hq, D], None)``. Inside
    :func:`shared_prefix`: the cascade over the prefix and the own columns; outside it:
    :func:`grouped_attention`."""
    return _engine(module, query, key, value, attention_mask, dropout, scaling, is_causal,
                   grouped=True, **kwargs)


def engine_attention_repeat(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                            is_causal=None, **kwargs):
    """:func:`engine_attention` with transformers' ``sdpa`` outside a shared prefix (keys and
    values copied per query head where it copies them): :data:`NAME_REPEAT`."""
    return _engine(module, query, key, value, attention_mask, dropout, scaling, is_causal,
                   grouped=False, **kwargs)


_FUNCTIONS = {NAME: engine_attention, NAME_REPEAT: engine_attention_repeat,
              GROUPED: grouped_attention}


def register() -> None:
    """Register :data:`NAME`, :data:`NAME_REPEAT` and :data:`GROUPED` with transformers'
    attention and mask interfaces (idempotent)."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    for name, fn in _FUNCTIONS.items():
        if name not in ALL_ATTENTION_FUNCTIONS.valid_keys():
            ALL_ATTENTION_FUNCTIONS.register(name, fn)
            ALL_MASK_ATTENTION_FUNCTIONS.register(name, sdpa_mask)


def attn_implementation(model) -> str | None:
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return getattr(config, "_attn_implementation", None)


def select_attention(*, engine: bool, grouped: bool) -> str:
    """The implementation a model loaded with ``sdpa`` switches to: the engine's (shared
    prefix; the CPU engine) or not, grouped heads without copies or not."""
    if engine:
        return NAME if grouped else NAME_REPEAT
    return GROUPED if grouped else "sdpa"


def use_attention(model, name: str) -> bool:
    """Switch ``model`` from ``sdpa`` to ``name`` (one of :data:`SDPA_LIKE`); returns whether
    it runs ``name`` now (models loaded with another implementation, e.g. eager, keep theirs)."""
    if name not in SDPA_LIKE:
        raise ValueError(f"unknown attention implementation {name!r}; expected one of {SDPA_LIKE}")
    if attn_implementation(model) != "sdpa":
        return False
    if name != "sdpa":
        register()
        model.set_attn_implementation(name)
    return attn_implementation(model) == name


def use_engine_attention(model, grouped: bool = True) -> bool:
    """Switch ``model`` from ``sdpa`` to the engine's attention (:data:`NAME`, or
    :data:`NAME_REPEAT` without grouped heads); returns whether it did."""
    return use_attention(model, select_attention(engine=True, grouped=grouped))
