"""Decode loops: from a prefilled batch to finished generations.

:func:`decode_rows` decodes one sequence per cache row; :func:`decode_stream_columns` decodes
several streams of each prompt as columns of the prompt's one cache row (streams with
equal tokens so far sharing one column). Both stop a sequence
at an end-of-turn token, a stop string or ``max_new_tokens`` (:class:`_Outputs`) and let
finished rows leave the cache in place (:func:`.cache.drop_rows`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from .cache import drop_rows, fork_cache, reserve, ring
from .packing import attention_mask_4d, model_mask
from .capabilities import Capabilities
from .prefill import Prefix, forward, positions, prefill
from .sampling import _Sampler


@dataclass
class DecodeStats:
    """What the decode forwards of a call computed: ``forwards`` (decode steps: one forward
    each), ``slots`` (token positions fed: cache rows x columns per step), ``tokens`` (the
    running sequences' tokens) and ``distinct`` (the positions that computed them: equal
    histories share one, :data:`SHARE_EQUAL_STREAMS`). ``dummy_slots``: masked padding
    columns; ``shared_tokens``: tokens that took another stream's position."""
    forwards: int = 0
    slots: int = 0
    tokens: int = 0
    distinct: int = 0

    def add(self, slots: int, tokens: int, distinct: int | None = None) -> None:
        self.forwards += 1
        self.slots += int(slots)
        self.tokens += int(tokens)
        self.distinct += int(tokens if distinct is None else distinct)

    def as_dict(self) -> dict:
        return {"forwards": self.forwards, "token_slots": self.slots, "tokens": self.tokens,
                "distinct": self.distinct, "dummy_slots": self.slots - self.distinct,
                "shared_tokens": self.tokens - self.distinct}


@dataclass
class Generation:
    text: str
    n_prompt_tokens: int
    n_gen_tokens: int
    finish_reason: str  # "eos" | "length"
    latency_s: float
    token_ids: list[int] = field(default_factory=list, repr=False)  # generated ids


class _Outputs:
    """What each decoded sequence has produced so far, and when and why it stopped; shared by
    all decode loops. ``t0s``: per sequence, when its latency starts (default: ``t0``)."""

    def __init__(self, lm, n: int, max_new_tokens: int, t0: float):
        self.tok, self.stop_ids, self.stop_strings = lm.tokenizer, set(lm.stop_ids), lm.stop_strings
        self.max_new_tokens, self.t0 = max_new_tokens, t0
        self.t0s = [t0] * n
        self.ids: list[list[int]] = [[] for _ in range(n)]
        self.finish: list[str | None] = [None] * n
        self.cut: list[int | None] = [None] * n  # text cut position for stop strings
        self.latency = [0.0] * n

    def append(self, active: list[int], tokens: list[int]) -> list[int]:
        """Append ``tokens[j]`` to sequence ``active[j]``; returns the positions j of the
        sequences still running."""
        keep = []
        for j, r in enumerate(active):
            t = tokens[j]
            self.ids[r].append(t)
            if t in self.stop_ids:
                self.finish[r] = "eos"
            elif self.stop_strings:
                text = self.tok.decode(self.ids[r], skip_special_tokens=True)
                hits = [text.find(s) for s in self.stop_strings if s in text]
                if hits:
                    self.finish[r], self.cut[r] = "eos", min(hits)
            if self.finish[r] is None and len(self.ids[r]) >= self.max_new_tokens:
                self.finish[r] = "length"
            if self.finish[r] is None:
                keep.append(j)
            else:
                self.latency[r] = time.perf_counter() - self.t0s[r]
        return keep

    def generations(self, n_prompt: list[int]) -> list[Generation]:
        gens = []
        for r, ids in enumerate(self.ids):
            body = ids[:-1] if self.finish[r] == "eos" and ids and ids[-1] in self.stop_ids else ids
            text = self.tok.decode(body, skip_special_tokens=True)
            if self.cut[r] is not None:
                text = text[:self.cut[r]]
            gens.append(Generation(text=text, n_prompt_tokens=n_prompt[r], n_gen_tokens=len(ids),
                                   finish_reason=self.finish[r] or "length",
                                   latency_s=self.latency[r], token_ids=ids))
        return gens


# Finished rows leave a decoding cache in place (:func:`.cache.drop_rows`); False: through a
# row-selecting copy of the whole cache (:func:`.cache.fork_cache`), the reference the
# equality tests compare the in-place path against.
IN_PLACE_DROP = True
# Dummy columns (a continuous batch's finished streams; a stream-column row's padding up to
# the step's widest row) are masked out of every running column's attention, so the
# feed-forward blocks skip them (:func:`.prefill.forward`'s ``ffn_selected_only``); False: every
# column runs them, the reference the equality tests and benchmarks/bench_skip_ffn.py compare.
SKIP_UNREAD_FFN = True
# A prompt's streams whose tokens so far are equal (a greedy stream and low-temperature samples
# often agree for many tokens) decode as one column of :func:`decode_stream_columns`; False:
# one column per running stream, the reference the equality tests and
# benchmarks/bench_share_streams.py compare.
SHARE_EQUAL_STREAMS = True


def _fork_rows(cache, keep: list[int]):
    return fork_cache(cache, rows=torch.tensor(keep, dtype=torch.long)), keep


def decode_rows(lm, cache, mask, logits, sampler: _Sampler, *, max_new_tokens: int,
            n_prompt: list[int], t0: float, prefix: Prefix | None = None,
            stats: DecodeStats | None = None) -> list[Generation]:
    """Decode one prefilled batch; returns one Generation per row (batch order). ``prefix``:
    the call's shared prefix, when the batch cache was prefilled on a detached one
    (:func:`.prefill.forward`). ``stats``: counts this call's decode forwards (one position
    per running row; rows never share)."""
    offset = prefix.offset if prefix is not None else 0
    n = logits.shape[0]
    out = _Outputs(lm, n, max_new_tokens, t0)
    active = list(range(n))
    for step in range(max_new_tokens):
        nxt = sampler(logits, active)
        keep = out.append(active, nxt.tolist())
        if not keep:
            break
        if step == 0:  # decode writes into preallocated buffers from here on
            rows = None if len(keep) == len(active) else torch.tensor(keep, dtype=torch.long)
            cache, order = reserve(cache, max_new_tokens, rows=rows), keep
        elif len(keep) < len(active):
            order = drop_rows(cache, keep) if IN_PLACE_DROP else _fork_rows(cache, keep)
            if not IN_PLACE_DROP:
                cache, order = order
        if len(keep) < len(active):
            sel = torch.tensor(order, dtype=torch.long, device=mask.device)
            mask = mask.index_select(0, sel)
            nxt = nxt.index_select(0, sel)
            active = [active[j] for j in order]
        mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
        pos = mask.sum(dim=1, keepdim=True) - 1 + offset
        logits = forward(lm, nxt.unsqueeze(1), mask, pos, cache, logits_to_keep=1,
                         prefix=prefix)[:, -1, :]
        if stats is not None:
            stats.add(len(active), len(active))
    return out.generations(n_prompt)


def decode_stream_columns(lm, cache, mask, logits, sampler: _Sampler, *, n_seeds: int,
                         max_new_tokens: int, n_prompt: list[int], t0: float,
                         prefix: Prefix | None = None,
                         stats: DecodeStats | None = None,
                         caps: Capabilities | None = None) -> list[Generation]:
    """Decode ``n_seeds`` streams of each prefilled row with ONE cache row per prompt.

    Each step feeds the prompt's running streams' tokens as columns of its row; a 4D mask lets
    each column see only the prompt and the columns of its own earlier tokens, with the
    position ids it would have alone, so each stream computes what a separate run computes
    while the prompt's keys/values are read once. Streams of a prompt whose tokens so far are
    equal (:data:`SHARE_EQUAL_STREAMS`) are one column: the same input at the same positions
    over the same keys gives the same logits, which each stream then samples with its own
    generator; when they part, each later column sees the shared columns as its own past.
    Sequences are stream-major (``s * n + i`` = stream s of prompt i); a row with fewer
    columns than the widest row that step pads with a masked column no one reads. ``caps``: the
    call's capabilities; with ``window_mask`` the step masks give the sliding layers their
    window by each column's position id (:func:`.packing.model_mask`)."""
    n, k = logits.shape[0], n_seeds
    out = _Outputs(lm, n * k, max_new_tokens, t0)
    dev = mask.device
    pad = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0
    active = list(range(n * k))
    row_of = list(range(n))          # current cache row of each prompt (-1 once dropped)
    alive_items = list(range(n))
    base = mask.bool()
    offset = prefix.offset if prefix is not None else 0
    gpos = torch.zeros((n, 0), dtype=torch.long)   # position id of every generated column
    # seen[r, s, g]: stream s of row r's prompt has its token at generated cache column g
    seen = torch.zeros((n, k, k * max_new_tokens), dtype=torch.bool)
    width = 0                        # generated cache columns so far (every row has as many)
    # each sequence's history as an id: its prompt at first, then its column of the last step
    # (one id per distinct history); (id, next token) names the history a step extends it to
    node = [v % n for v in range(n * k)]
    cur, rows = logits, [v % n for v in active]   # logits row of each active sequence
    for step in range(max_new_tokens):
        nxt_list = sampler(cur, active, rows).tolist()
        keep = out.append(active, nxt_list)
        if not keep:
            break
        still = {active[j] % n for j in keep}
        kept_rows = sorted(row_of[i] for i in still)
        if step == 0:  # decode writes into preallocated buffers from here on
            sel = None if len(still) == len(alive_items) else torch.tensor(kept_rows, dtype=torch.long)
            cache, order = reserve(cache, k * max_new_tokens, rows=sel), kept_rows
        elif len(still) < len(alive_items):
            order = drop_rows(cache, kept_rows) if IN_PLACE_DROP else _fork_rows(cache, kept_rows)
            if not IN_PLACE_DROP:
                cache, order = order
        if len(still) < len(alive_items):
            # row r now holds the prompt of old row order[r]
            item_at = {row_of[i]: i for i in alive_items}
            idx = torch.tensor(order, dtype=torch.long)
            base, seen = base.index_select(0, idx.to(dev)), seen.index_select(0, idx)
            gpos = gpos.index_select(0, idx)
            alive_items = [item_at[o] for o in order]
            row_of = [-1] * n
            for r, i in enumerate(alive_items):
                row_of[i] = r
        r_n = len(alive_items)
        active, tokens = [active[j] for j in keep], [nxt_list[j] for j in keep]
        # one column per distinct history (per running stream without sharing), first come
        col_of: dict[object, int] = {}
        cols_in_row = [0] * r_n
        feed: list[tuple[int, int, int, int]] = []   # (row, column, token, a member stream)
        rows = []
        for v, t in zip(active, tokens):
            key = (node[v], t) if SHARE_EQUAL_STREAMS else v
            r = row_of[v % n]
            c = col_of.get(key)
            if c is None:
                c = col_of[key] = len(feed)
                feed.append((r, cols_in_row[r], t, v // n))
                cols_in_row[r] += 1
            rows.append(c)
            node[v] = c
            seen[r, v // n, width + feed[c][1]] = True
        w = max(cols_in_row)
        fr, fc, ft, fs = (torch.tensor(f, dtype=torch.long) for f in zip(*feed))
        c0 = base.shape[1]
        inp = torch.full((r_n, w), pad, dtype=torch.long)
        inp[fr, fc] = ft
        # a padding column sees only itself; a real one its prompt and its history's columns
        allowed = torch.zeros((r_n, w, c0 + width + w), dtype=torch.bool)
        allowed[:, :, c0 + width + torch.arange(w)] = torch.eye(w, dtype=torch.bool)
        allowed[fr, fc, :c0] = base.cpu()[fr]
        allowed[fr, fc, c0:] = seen[fr, fs, :width + w]
        select = (fr.to(dev), fc.to(dev))
        pos = torch.tensor([[n_prompt[i] + step] * w for i in alive_items], dtype=torch.long)
        kpos = None
        if caps is not None and caps.window_mask:  # the prompt's columns count from its first token
            kpos = torch.cat([positions(base.cpu(), c0, offset), gpos, pos], dim=1)
        attn = model_mask(lm, allowed, caps=caps, qpos=pos, kpos=kpos, device=dev)
        cur = forward(lm, inp.to(dev), attn, pos.to(dev), cache,
                      prefix=prefix, select=select, ffn_selected_only=SKIP_UNREAD_FFN)
        gpos = torch.cat([gpos, pos], dim=1)
        width += w
        if stats is not None:
            stats.add(r_n * w, len(active), len(feed))
    return out.generations([n_prompt[v % n] for v in range(n * k)])


def _step_input(streams: list[int], tokens: list[int], row_of, n: int, k: int, r_n: int,
                pad: int, dev) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """One decode step's input for stream columns: an ``[r_n, k]`` grid holding each running
    stream ``v``'s next token (``tokens``, in ``streams`` order) at its cache row
    ``row_of(v)`` and column ``v // n`` (its stream), pad elsewhere (finished streams' masked
    dummy columns); and the ``(rows, cols)`` select of the running streams, the only positions
    whose logits ``forward`` projects."""
    inp = torch.full((r_n, k), pad, dtype=torch.long)
    rows, cols = [row_of(v) for v in streams], [v // n for v in streams]
    for r, c, t in zip(rows, cols, tokens):
        inp[r, c] = t
    return inp, (torch.tensor(rows, dtype=torch.long, device=dev),
                 torch.tensor(cols, dtype=torch.long, device=dev))


def decode_continuous(lm, prefix: Prefix, caps, seqs: list[list[int]], sampler: _Sampler, *,
                      n_seeds: int, max_new_tokens: int, slots: int, store=None,
                      stats: DecodeStats | None = None) -> list[Generation] | None:
    """Decode ``n_seeds`` streams of every sequence of ``seqs`` (longest first) as stream
    columns of ``slots`` cache rows refilled from the queue: when a row's prompt has finished,
    the next waiting prompt is prefilled into that row. Sequences are stream-major (``s * n +
    i`` = stream s of prompt i), each with its own generator.

    The first ``slots`` prompts set the prefill columns (later ones are no longer and fit them
    right-aligned); stream columns form a ring of ``n_seeds x max_new_tokens`` columns
    (:func:`.cache.ring`) that a prompt never wraps onto while it runs, so the cache never
    outgrows the first batch and its memory plan holds for the whole queue. Returns None where
    the cache layers cannot run as a ring."""
    n, k, T = len(seqs), n_seeds, max_new_tokens
    dev = lm.device
    pad = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0
    t_call = time.perf_counter()
    out = _Outputs(lm, n * k, max_new_tokens, t_call)
    queue = list(range(n))
    first, queue = queue[:slots], queue[slots:]
    cache, mask0, logits0 = prefill(lm, prefix, [seqs[i] for i in first], caps, store=store)
    c0 = mask0.shape[1]
    cache = reserve(cache, k * T)
    if not ring(cache, c0):
        return None
    q_pre = len(prefix) - prefix.offset            # prefix columns inside the cache rows
    base = torch.zeros((len(first), c0), dtype=torch.bool, device=dev)
    base[:] = mask0.bool()
    row_item = list(first)                         # the prompt of each cache row (-1: free)
    start = [0] * len(first)                       # the step at which the row's prompt began
    own = torch.eye(k, dtype=torch.bool, device=dev)
    pending: dict[int, int] = {}                   # running sequence -> token to feed next

    def sample(seq_ids: list[int], logits: torch.Tensor) -> None:
        toks = sampler(logits, seq_ids).tolist()
        kept = set(out.append(seq_ids, toks))
        for j, v in enumerate(seq_ids):
            if j in kept:
                pending[v] = toks[j]

    def admit(rows: list[int], step: int) -> None:
        """Prefill the next prompts of the queue into the free ``rows``; sample their first
        tokens."""
        items = queue[:len(rows)]
        del queue[:len(items)]
        rows = rows[:len(items)]
        t_adm = time.perf_counter()
        c2, m2, lg2 = prefill(lm, prefix, [seqs[i] for i in items], caps, store=store)
        width = m2.shape[1]
        if width > c0:
            raise RuntimeError("decode_continuous: a refill prompt is longer than the first "
                               "batch's (the queue must be longest first)")
        cols = torch.cat([torch.arange(q_pre), torch.arange(c0 - width + q_pre, c0)])
        ridx = torch.tensor(rows, dtype=torch.long)
        for layer, src in zip(cache.layers, c2.layers):
            layer.write_rows(ridx, cols, src.keys, src.values)
        for j, (r, i) in enumerate(zip(rows, items)):
            base[r] = False
            base[r, cols.to(dev)] = m2[j].bool()
            row_item[r], start[r] = i, step
            for s_ in range(k):
                out.t0s[s_ * n + i] = t_adm
        seq_ids = [s_ * n + i for s_ in range(k) for i in items]
        sample(seq_ids, lg2.repeat(k, 1))

    sample([s_ * n + i for s_ in range(k) for i in first], logits0.repeat(k, 1))
    step = 0
    while True:
        # rows whose prompt is done take the next prompts of the queue (which may finish at
        # once: then their rows are free again)
        while queue:
            live = {v % n for v in pending}
            free = [r for r, i in enumerate(row_item) if i < 0 or i not in live]
            if not free:
                break
            admit(free, step)
        live = {v % n for v in pending}
        if not live:
            break
        done = [r for r, i in enumerate(row_item) if i not in live]
        if done:  # the queue is empty: finished rows leave the cache in place
            keep = [r for r, i in enumerate(row_item) if i in live]
            order = drop_rows(cache, keep)
            base = base.index_select(0, torch.tensor(order, dtype=torch.long, device=dev))
            row_item = [row_item[o] for o in order]
            start = [start[o] for o in order]
        r_n = len(row_item)
        row_of = {i: r for r, i in enumerate(row_item)}
        running = sorted(pending)
        inp, select = _step_input(running, [pending[v] for v in running], lambda v: row_of[v % n],
                                  n, k, r_n, pad, dev)
        pos = torch.tensor([[len(seqs[i]) + step - start[r]] * k for r, i in enumerate(row_item)],
                           dtype=torch.long)
        # ring blocks written so far: block b was last written at step step - ((step - b) % T)
        blocks = min(step + 1, T)
        last = torch.tensor([step - ((step - b) % T) for b in range(blocks)], dtype=torch.long)
        valid = last[None, :] >= torch.tensor(start, dtype=torch.long)[:, None]   # [R, blocks]
        ringm = (valid[:, None, :, None] & own.cpu()[None, :, None, :]).reshape(r_n, k, blocks * k)
        allowed = torch.cat([base.cpu()[:, None, :].expand(r_n, k, c0), ringm], dim=2)
        cur = forward(lm, inp.to(dev), attention_mask_4d(lm, allowed).to(dev), pos.to(dev), cache,
                      prefix=prefix, select=select, ffn_selected_only=SKIP_UNREAD_FFN)
        if stats is not None:
            stats.add(r_n * k, len(running))
        step += 1
        pending.clear()
        sample(running, cur)
    return out.generations([len(seqs[v % n]) for v in range(n * k)])
