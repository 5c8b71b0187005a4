"""Packed candidate scoring: each item's context and the token tree of ALL its candidates in
a few dense rows, scored in one forward per batch of items.

A node per distinct candidate prefix lets shared openings be computed once; a node attends to
the shared prefix, its item's context and its own ancestors, with the position id it has in
``context + candidate``. Items are packed first-fit-decreasing into rows (:func:`pack_rows`)
under a block-diagonal mask, and only positions that predict a candidate token are projected
to logits. Needs an attention that takes an arbitrary 4D mask and, on sliding-window models,
items that fit the window (:func:`packed_supported`); otherwise the scorer forks the cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .attention import SDPA_LIKE

MASKABLE = (*SDPA_LIKE, "eager")
LAYER_KINDS = ("full_attention", "sliding_attention")
MAX_ROW_FACTOR = 4   # rows hold at most this many times the longest item ...
MAX_ROW_TOKENS = 512  # ... and at most this many columns (unless one item is longer)
ATTN_WEIGHT = 2048    # per-token cost of the linear layers, in attended-key units (see pack_rows)


def _text_config(config):
    get = getattr(config, "get_text_config", None)
    return get() if callable(get) else config


def packed_supported(lm, max_position: int) -> bool:
    """Whether items whose position ids stay below ``max_position`` (prefix included) can be
    scored packed on ``lm``."""
    try:
        from transformers.modeling_utils import slice_logits_to_keep  # noqa: F401
    except ImportError:  # older transformers: no boolean logits_to_keep
        return False
    config = _text_config(lm.model.config)
    if getattr(config, "_attn_implementation", None) not in MASKABLE:
        return False
    kinds = set(getattr(config, "layer_types", None) or [])
    if kinds - set(LAYER_KINDS):
        return False
    window = sliding_window(config)
    return window is None or max_position <= window


def sliding_window(config) -> int | None:
    """The window of a model config's sliding-window layers; None if it has none (0: it has
    some but no window is configured, so no position count fits)."""
    config = _text_config(config)
    kinds = set(getattr(config, "layer_types", None) or [])
    window = getattr(config, "sliding_window", None)
    sliding = "sliding_attention" in kinds or (
        not kinds and window is not None and getattr(config, "use_sliding_window", True))
    if not sliding:
        return None
    return int(window) if window is not None else 0


@dataclass
class ItemTree:
    """One item's columns: context suffix then candidate-prefix nodes."""
    tokens: list[int]
    positions: list[int]
    n_ctx: int                        # the first n_ctx columns are the context suffix
    parent: list[int]                 # per node column: parent column (-1: the context)
    targets: list[tuple[int, int, int]]  # (column predicting it, token id, candidate index)

    def __len__(self) -> int:
        return len(self.tokens)


def item_tree(prefix_len: int, ctx: list[int], conts: list[list[int]]) -> ItemTree:
    suffix = ctx[prefix_len:]
    if not suffix:
        raise ValueError("every context must keep at least one token after the shared prefix")
    tokens, positions = list(suffix), list(range(prefix_len, len(ctx)))
    parent: list[int] = []
    nodes: dict[tuple[int, ...], int] = {}
    last_ctx = len(suffix) - 1
    targets = []
    for j, c in enumerate(conts):
        if not c:
            raise ValueError(f"candidate {j} has no tokens")
        targets.append((last_ctx, c[0], j))
        prev = -1
        for d in range(1, len(c)):
            key = tuple(c[:d])
            col = nodes.get(key)
            if col is None:
                col = nodes[key] = len(tokens)
                tokens.append(c[d - 1])
                positions.append(len(ctx) + d - 1)
                parent.append(prev)
            targets.append((col, c[d], j))
            prev = col
    return ItemTree(tokens, positions, len(suffix), parent, targets)


def tree_positions(ctx: list[int], conts: list[list[int]]) -> int:
    """Position ids an item needs: its full context + its longest candidate but one token."""
    return len(ctx) + max(len(c) - 1 for c in conts)


def tree_columns(prefix_len: int, ctx: list[int], conts: list[list[int]]) -> int:
    """Columns an item occupies: context suffix + distinct candidate prefixes."""
    return len(ctx) - prefix_len + len({tuple(c[:d]) for c in conts for d in range(1, len(c))})


def _item_mask(tree: ItemTree) -> torch.Tensor:
    """[n, n] bool: column q may attend column k, within one item."""
    n, nc = len(tree), tree.n_ctx
    m = torch.zeros((n, n), dtype=torch.bool)
    m[:nc, :nc] = torch.tril(torch.ones((nc, nc), dtype=torch.bool))
    m[nc:, :nc] = True
    for i, par in enumerate(tree.parent):
        q = nc + i
        if par >= 0:
            m[q, nc:] = m[par, nc:]
        m[q, q] = True
    return m


def first_fit_rows(sizes: list[int], width: int) -> list[list[int]]:
    """Indices of ``sizes`` packed first-fit-decreasing into rows of ``width``."""
    rows: list[list[int]] = []
    free: list[int] = []
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        for r, f in enumerate(free):
            if sizes[i] <= f:
                rows[r].append(i)
                free[r] -= sizes[i]
                break
        else:
            rows.append([i])
            free.append(width - sizes[i])
    return rows


def pack_rows(sizes: list[int], prefix_len: int = 0) -> list[list[int]]:
    """Rows for items of ``sizes`` columns: first-fit-decreasing at the row width (from the
    longest item up to ``MAX_ROW_FACTOR`` times it, at most ``MAX_ROW_TOKENS``) that minimises
    the estimated cost ``rows * width * (ATTN_WEIGHT + prefix_len + width)``. ``ATTN_WEIGHT``
    approximates a token's linear-layer cost in units of one attended key; the choice is not
    sensitive to it."""
    longest = max(sizes)
    best, best_cost = None, None
    widths = {longest} | {min(longest * k, max(MAX_ROW_TOKENS, longest))
                          for k in range(2, MAX_ROW_FACTOR + 1)}
    for w in sorted(widths):
        rows = first_fit_rows(sizes, w)
        width = max(sum(sizes[i] for i in r) for r in rows)
        cost = len(rows) * width * (ATTN_WEIGHT + prefix_len + width)
        if best_cost is None or cost < best_cost:
            best, best_cost = rows, cost
    return best


@dataclass
class Pack:
    input_ids: torch.Tensor      # [R, W]
    position_ids: torch.Tensor   # [R, W]
    allowed: torch.Tensor        # [R, W, P + W] bool: query may attend key
    keep: torch.Tensor           # [R, W] bool: columns whose logits are needed
    gather_col: torch.Tensor     # [G] index into the kept logits (row-major order)
    gather_tgt: torch.Tensor     # [G] the scored token id
    gather_cand: torch.Tensor    # [G] index into ``cand_index``
    cand_index: list[tuple[int, int]]  # (item in pack, candidate) of each candidate


def pack_items(prefix_len: int, ctx_ids: list[list[int]], cont_ids: list[list[list[int]]], *,
               pad_id: int) -> Pack:
    """Pack the items (full context ids, each starting with the shared prefix of length
    ``prefix_len``; candidate ids) into rows; see the module docstring."""
    p = prefix_len
    trees = [item_tree(p, c, cs) for c, cs in zip(ctx_ids, cont_ids)]
    rows = pack_rows([len(t) for t in trees], p)
    width = max(sum(len(trees[i]) for i in r) for r in rows)
    n_rows = len(rows)
    inp = torch.full((n_rows, width), pad_id, dtype=torch.long)
    pos = torch.zeros((n_rows, width), dtype=torch.long)
    new = torch.zeros((n_rows, width, width), dtype=torch.bool)
    new[:, range(width), range(width)] = True  # padding columns see themselves
    real = torch.zeros((n_rows, width), dtype=torch.bool)
    keep = torch.zeros((n_rows, width), dtype=torch.bool)
    where: dict[int, tuple[int, int]] = {}
    for r, items in enumerate(rows):
        off = 0
        for i in items:
            t = trees[i]
            n = len(t)
            inp[r, off:off + n] = torch.tensor(t.tokens, dtype=torch.long)
            pos[r, off:off + n] = torch.tensor(t.positions, dtype=torch.long)
            new[r, off:off + n, off:off + n] = _item_mask(t)
            real[r, off:off + n] = True
            for col, _, _ in t.targets:
                keep[r, off + col] = True
            where[i] = (r, off)
            off += n
    # kept logits come out row-major: the rank of each kept (row, column)
    rank = torch.full((n_rows, width), -1, dtype=torch.long)
    rank[keep] = torch.arange(int(keep.sum()))
    g_col, g_tgt, g_cand, cand_index = [], [], [], []
    for i, t in enumerate(trees):
        r, off = where[i]
        base = len(cand_index)
        cand_index.extend((i, j) for j in range(len(cont_ids[i])))
        for col, tok, j in t.targets:
            g_col.append(int(rank[r, off + col]))
            g_tgt.append(tok)
            g_cand.append(base + j)
    allowed = torch.cat([real[:, :, None].expand(n_rows, width, p), new], dim=2)
    tt = torch.tensor
    return Pack(inp, pos, allowed, keep, tt(g_col), tt(g_tgt), tt(g_cand), cand_index)


def model_mask(lm, allowed: torch.Tensor, *, caps=None, qpos: torch.Tensor | None = None,
               kpos: torch.Tensor | None = None, device=None):
    """The ``attention_mask`` argument for ``allowed`` [B, Q, K] on ``device``: one 4D mask
    (:func:`attention_mask_4d`), or for a call whose sliding layers the engine masks
    (``caps``: :class:`.capabilities.Capabilities` with ``window_mask``) one per layer kind,
    the sliding layers' keeping only keys fewer than the window's length of positions behind
    their query (``qpos`` [B, Q] and ``kpos`` [B, K]: position ids; transformers' sliding
    rule, counted in positions where a model's own mask counts cache columns)."""
    full = attention_mask_4d(lm, allowed)
    if caps is None or not caps.window_mask:
        return full.to(device) if device is not None else full
    near = (qpos[:, :, None] - kpos[:, None, :]) < sliding_window(lm.model.config)
    masks = {"full_attention": full, "sliding_attention": attention_mask_4d(lm, allowed & near)}
    return {k: v.to(device) for k, v in masks.items()} if device is not None else masks


def packed_key_positions(pos: torch.Tensor, prefix_cols: int) -> torch.Tensor:
    """Position ids of a packed forward's keys ``[rows, prefix_cols + width]``: the prefix
    columns in the batch cache (0, 1, ...) then the packed columns (``pos`` [rows, width])."""
    if not prefix_cols:
        return pos
    return torch.cat([torch.arange(prefix_cols).expand(pos.shape[0], prefix_cols), pos], dim=1)


def attention_mask_4d(lm, allowed: torch.Tensor) -> torch.Tensor:
    """``allowed`` [B, Q, K] as the model's 4D mask [B, 1, Q, K]: boolean for sdpa, additive
    float (0 / dtype min) for eager attention."""
    config = _text_config(lm.model.config)
    m = allowed[:, None]
    if config._attn_implementation in SDPA_LIKE:
        return m
    dtype = lm.model.dtype
    return torch.zeros(m.shape, dtype=dtype).masked_fill(~m, torch.finfo(dtype).min)
