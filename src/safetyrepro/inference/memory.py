"""Generation batches sized by their memory footprint against a budget.

A prompt of a decode group decodes every stream of the group and reserves room for all their
tokens, so ``generation.batch_size`` (a prompt count) alone does not bound memory.
:func:`plan_batches` takes prompts longest first and closes a batch when one more would exceed
``batch_size`` or make :func:`generation_footprint` exceed the :class:`MemoryBudget`: a fixed
fraction of the device's total memory minus weights, the prefill store and a reserve. The
budget never reads the memory free at the moment, so a rerun plans the same batches (recorded
in the shard). The footprint is an estimate (the larger of the prefill and decode peaks);
out-of-memory errors that still happen split the batch (:func:`.batching.run_with_oom_fallback`).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Callable

MEMORY_FRACTION = 0.9      # of the device's total memory
RESERVE_BYTES = 1 << 30    # runtime reserve (CUDA context, fragmentation / the OS on a CPU)
SAMPLER_BYTES = 4 * 4 + 8  # float32 work tensors per vocabulary entry and sequence, int64 order


@dataclass(frozen=True)
class ModelDims:
    """What the footprint model needs to know about a model."""
    layers: int
    hidden: int
    intermediate: int
    q_heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    act_bytes: int      # bytes of one activation / cache value (the compute dtype)
    weight_bytes: int   # parameters and buffers as loaded (4-bit weights packed), and
    #                     oneDNN's packed copies of bf16 linear weights (CPU)

    @property
    def kv_token_bytes(self) -> int:
        """Keys and values of one token over all layers."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.act_bytes

    @classmethod
    def of(cls, lm) -> "ModelDims":
        from ..models.packed_linear import packed_bytes

        model = lm.model
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        q_heads = int(config.num_attention_heads)
        head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // q_heads)
        weights = sum(t.numel() * t.element_size() for t in model.parameters())
        weights += sum(t.numel() * t.element_size() for t in model.buffers())
        weights += packed_bytes(model)
        dtype = getattr(model, "dtype", None)
        act = dtype.itemsize if dtype is not None and getattr(dtype, "is_floating_point", False) else 2
        return cls(layers=int(config.num_hidden_layers), hidden=int(config.hidden_size),
                   intermediate=int(config.intermediate_size), q_heads=q_heads,
                   kv_heads=int(getattr(config, "num_key_value_heads", None) or q_heads),
                   head_dim=head_dim, vocab=int(config.vocab_size), act_bytes=int(act),
                   weight_bytes=int(weights))


def device_total_bytes(device) -> int:
    """Total memory of ``device`` (a CUDA device's capacity; a CPU's physical memory)."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        return int(torch.cuda.get_device_properties(dev).total_memory)
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


@dataclass(frozen=True)
class MemoryBudget:
    total_bytes: int
    weight_bytes: int
    store_bytes: int
    fraction: float = MEMORY_FRACTION
    reserve_bytes: int = RESERVE_BYTES

    @property
    def budget_bytes(self) -> int:
        """Bytes a batch may use: the fraction of the total less weights, store and reserve."""
        return int(self.total_bytes * self.fraction) - self.weight_bytes - self.store_bytes \
            - self.reserve_bytes

    def record(self) -> dict:
        return asdict(self) | {"budget_bytes": self.budget_bytes}


def budget_for(lm, dims: ModelDims, *, store_bytes: int = 0,
               total_bytes: int | None = None) -> MemoryBudget:
    """The budget of ``lm`` on its device (``total_bytes`` overrides the device's total)."""
    total = device_total_bytes(lm.info["device"]) if total_bytes is None else int(total_bytes)
    return MemoryBudget(total, dims.weight_bytes, int(store_bytes))


def generation_footprint(dims: ModelDims, *, rows: int, width: int, prefix: int, detached: bool,
                         streams: int, max_new_tokens: int, columns: bool,
                         largest_kind: int = 1, grouped: bool = False) -> int:
    """Estimated peak bytes of one generation batch: ``rows`` prompts whose longest suffix after
    the shared ``prefix`` has ``width`` tokens, each decoding ``streams`` streams of up to
    ``max_new_tokens`` tokens, as stream columns (``columns``) or as repeated rows, one kind at
    a time (``largest_kind``: the streams of the largest kind). ``grouped``: the model's
    attention folds query heads (:data:`.attention.GROUPED` or :data:`.attention.NAME`), so a
    mask is repeated per folded head instead of keys/values per query head."""
    d = dims
    folds = d.q_heads // d.kv_heads

    def per_head(n_rows: int, q: int, cols: int) -> int:
        """The attention kernel's extra bytes: keys/values copied per query head, or the mask
        repeated per folded head (boolean + additive float)."""
        if grouped:
            return n_rows * q * folds * cols * (1 + d.act_bytes) if q > 1 else 0
        return 2 * n_rows * d.q_heads * cols * d.head_dim * d.act_bytes
    kv = d.kv_token_bytes
    copied = 0 if detached else prefix
    keys = copied + width                             # columns of a prefilled row
    shared = prefix * kv                              # the prefix, once
    prefill_kv = rows * keys * kv
    tokens = rows * width
    per_token = 4 * d.hidden + 3 * d.intermediate + (d.q_heads + 2 * d.kv_heads) * d.head_dim
    prefill_peak = (prefill_kv + tokens * per_token * d.act_bytes
                    + tokens * keys                                           # 4D bool mask
                    + per_head(rows, width, keys)
                    + rows * d.vocab * (d.act_bytes + 4))                     # last logits
    if columns:
        cache_rows, q, cols = rows, streams, keys + streams * max_new_tokens
        forked = 0
    else:
        cache_rows, q, cols = rows * largest_kind, 1, keys + max_new_tokens
        forked = cache_rows * keys * kv               # the kind's rows, forked from the prefill
    seqs = rows * streams if columns else cache_rows
    decode_peak = (prefill_kv + forked + cache_rows * cols * kv
                   + seqs * per_token * d.act_bytes
                   + cache_rows * q * cols                                        # 4D bool mask
                   + per_head(cache_rows, q, cols)
                   + seqs * d.vocab * (d.act_bytes + 4 + SAMPLER_BYTES))
    return int(shared + max(prefill_peak, decode_peak))


def plan_batches(lengths: list[int], cap: int, footprint: Callable[[int, int], int],
                 budget: int) -> list[tuple[list[int], int]]:
    """Indices of ``lengths`` longest first (ties in input order) in batches of at most ``cap``
    that each fit ``budget`` by ``footprint(rows, longest length)``; a single item that does
    not fit still forms a batch (its run may then fail or split, and says so). Returns
    ``[(indices, footprint bytes)]``. With room for ``cap`` everywhere this is exactly
    :func:`.batching.length_batches`."""
    if cap < 1:
        raise ValueError(f"batch_size must be >= 1, got {cap}")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    out, i = [], 0
    while i < len(order):
        width = lengths[order[i]]
        m = 1
        while m < cap and i + m < len(order) and footprint(m + 1, width) <= budget:
            m += 1
        out.append((order[i:i + m], footprint(m, width)))
        i += m
    return out


def max_rows(footprint: Callable[[int], int], budget: int, cap: int) -> int:
    """The most rows (up to ``cap``) whose ``footprint(rows)`` fits ``budget``; 0 if none."""
    m = 0
    while m < cap and footprint(m + 1) <= budget:
        m += 1
    return m
