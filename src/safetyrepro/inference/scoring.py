"""Log-likelihood scoring of candidate continuations.

A candidate's ``loglik`` is the sum of its tokens' float32 log-probabilities given the context
(tokenised by :func:`.encoding.encode_pair`); ``is_greedy`` says whether every candidate token
is the argmax (lm-evaluation-harness's "is_greedy"). :func:`score_candidates` runs each context
once on top of the shared prefix, either ``packed`` (:mod:`.packing`: one forward per batch of
items; past a sliding window with the window masked by position,
:attr:`.capabilities.Capabilities.window_mask`) or ``fork`` (prefilled contexts forked once per
candidate; for attention without arbitrary masks, and past the window of a model that takes no
mask per layer kind, where no prefix is shared). :func:`score_candidates_plain` is the
reference (one full forward per candidate). A non-finite log-likelihood raises CellError.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from ..errors import CellError
from .batching import Progress, chunks, length_batches, run_with_oom_fallback
from .encoding import encode_continuation, encode_prompt, split_trailing_space
from .cache import fork_cache, new_cache
from .capabilities import Capabilities
from .prefill import build_prefix, forward, positions, prefill
from .packing import (model_mask, pack_items, packed_key_positions, packed_supported,
                      tree_columns, tree_positions)


@dataclass
class CandidateScore:
    loglik: float
    n_tokens: int
    is_greedy: bool


def check_finite(logliks, item: int) -> None:
    """CellError if any value in ``logliks`` (tensor / floats) is NaN or infinite."""
    vals = logliks.flatten().tolist() if isinstance(logliks, torch.Tensor) else list(logliks)
    bad = [j for j, v in enumerate(vals) if not math.isfinite(v)]
    if bad:
        raise CellError(f"item {item}: non-finite log-likelihood {vals[bad[0]]} for candidate "
                        f"{bad[0]} (numerical failure in the model's logits)")


def _encode(lm, contexts: list[str], candidates: list[list[str]]):
    if len(contexts) != len(candidates):
        raise ValueError(f"{len(contexts)} contexts but {len(candidates)} candidate lists")
    tok = lm.tokenizer
    ctx_ids, cont_ids = [], []
    for i, (ctx, cands) in enumerate(zip(contexts, candidates)):
        moved = [split_trailing_space(ctx, c) for c in cands]
        base = moved[0][0] if moved else ctx.rstrip(" \t")
        ids = encode_prompt(tok, base)
        if not ids:
            raise CellError(f"item {i}: the context encodes to no tokens; nothing to condition on")
        conts = []
        for j, (_, c) in enumerate(moved):
            cid = encode_continuation(tok, c)
            if not cid:
                raise CellError(f"item {i}: candidate {j} ({cands[j]!r}) encodes to no tokens")
            conts.append(cid)
        ctx_ids.append(ids)
        cont_ids.append(conts)
    return ctx_ids, cont_ids


def log_probs(logits: torch.Tensor) -> torch.Tensor:
    """Log-probabilities ``logits - logsumexp(logits)`` in float32: on a CPU more exact than
    float32 ``torch.log_softmax``, which matters when long candidates sum many tokens; every
    scorer uses it, so they agree to reassociation error."""
    logits = logits.float()
    return logits - torch.logsumexp(logits, dim=-1, keepdim=True)


def _token_stats(logp: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row target log-probs and argmax hits for log-prob matrix ``[..., V]``."""
    lp = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    hit = logp.argmax(dim=-1) == targets
    return lp, hit


METHODS = ("auto", "packed", "fork")
LOGITS_BUDGET = 1 << 26   # float32 logit elements per packed forward (256 MiB)


class _PackedUnsupported(Exception):
    """The model's forward did not honour a boolean ``logits_to_keep``."""


def score_candidates(lm, contexts: list[str], candidates: list[list[str]], *,
                     batch_size: int = 16, progress=None, prefix_cache: bool = True,
                     method: str = "auto", store=None, record=None) -> list[list[CandidateScore]]:
    """Score ``candidates[i][j]`` as a continuation of ``contexts[i]``; scores in input order.

    ``method``: ``"packed"``, ``"fork"`` or ``"auto"`` (packed where the model supports it).
    ``store``: a :class:`.store.PrefillStore` whose prefixes are reused. ``record``: a
    :class:`.batching.BatchRecord` that receives every out-of-memory split."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, not {method!r}")
    ctx_ids, cont_ids = _encode(lm, contexts, candidates)
    return score_token_candidates(lm, ctx_ids, cont_ids, batch_size=batch_size, progress=progress,
                                  prefix_cache=prefix_cache, method=method, store=store, record=record)


def score_token_candidates(lm, ctx_ids: list[list[int]], cont_ids: list[list[list[int]]], *,
                           batch_size: int = 16, progress=None, prefix_cache: bool = True,
                           method: str = "auto", store=None, record=None) -> list[list[CandidateScore]]:
    """:func:`score_candidates` on token ids already encoded by the caller (``ctx_ids[i]``:
    item ``i``'s context, ``cont_ids[i][j]``: its candidate ``j``; every list non-empty), for
    callers with their own tokenisation rule (lm-eval's requests, :mod:`safetyrepro.crosspkg`)."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, not {method!r}")
    if len(ctx_ids) != len(cont_ids):
        raise ValueError(f"{len(ctx_ids)} contexts but {len(cont_ids)} candidate lists")
    for i, (c, cs) in enumerate(zip(ctx_ids, cont_ids)):
        if not c:
            raise CellError(f"item {i}: the context has no tokens; nothing to condition on")
        if not cs or any(not x for x in cs):
            raise CellError(f"item {i}: no candidates, or a candidate without tokens")
    splits = record.splits if record is not None else None
    bar = Progress(progress, len(ctx_ids), "score")
    try:
        with torch.inference_mode():
            max_pos = max(tree_positions(c, cs) for c, cs in zip(ctx_ids, cont_ids))
            # packed scoring checks its window itself; past it, it masks the sliding layers
            # by position where the model allows (Capabilities.window_mask)
            caps = Capabilities.of(lm, max_pos, window_full=False)
            packed_ok = method != "fork" and (packed_supported(lm, max_pos) or caps.window_mask)
            if not packed_ok and caps.window_mask:
                # the fork path's continuations take the model's own masks: it runs without
                # window masks (past the window, then, with no shared prefix)
                caps = Capabilities.of(lm, max_pos, window_full=False, window_masks=False)
            prefix = build_prefix(lm, ctx_ids, caps, enabled=prefix_cache, store=store)
            if method == "packed" and not packed_ok:
                raise ValueError("packed scoring is not supported for this model/length "
                                 "(attention implementation or sliding window); use method='fork'")
            if packed_ok:
                try:
                    return _score(lm, ctx_ids, cont_ids, functools.partial(
                        _run_packed, lm, caps, prefix, ctx_ids, cont_ids, bar),
                        _packed_batches(lm, len(prefix), ctx_ids, cont_ids, batch_size), splits)
                except _PackedUnsupported:
                    if method == "packed":
                        raise ValueError("this model's forward ignores a boolean logits_to_keep; "
                                         "use method='fork'") from None
            return _score(lm, ctx_ids, cont_ids, functools.partial(
                _run_fork, lm, caps, prefix, ctx_ids, cont_ids, bar, batch_size),
                length_batches([len(c) for c in ctx_ids], batch_size), splits)
    finally:
        bar.close()


def _score(lm, ctx_ids, cont_ids, run, batches, splits=None) -> list[list[CandidateScore]]:
    out: dict[int, list[CandidateScore]] = {}
    for rows in batches:
        out.update(run_with_oom_fallback(
            rows, run, what="log-likelihood scoring", device=lm.info["device"],
            n_tokens=lambda rs: sum(len(ctx_ids[i]) + sum(map(len, cont_ids[i])) for i in rs),
            splits=splits))
    return [out[i] for i in range(len(ctx_ids))]


def _results(rows, cont_ids, ll, greedy) -> dict:
    res = {}
    for b, i in enumerate(rows):
        scores = [CandidateScore(loglik=ll[(b, j)], n_tokens=len(cont_ids[i][j]),
                                 is_greedy=greedy[(b, j)]) for j in range(len(cont_ids[i]))]
        check_finite([s.loglik for s in scores], i)
        res[i] = scores
    return res


def _packed_batches(lm, p: int, ctx_ids, cont_ids, batch_size: int) -> list[list[int]]:
    """Items grouped longest first into batches of at most ``batch_size`` items whose kept
    logits stay under :data:`LOGITS_BUDGET` elements (a single item may exceed it)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    vocab = lm.model.get_output_embeddings().weight.shape[0]
    cols = [tree_columns(p, c, cs) for c, cs in zip(ctx_ids, cont_ids)]
    out, cur, n_kept = [], [], 0
    for i in sorted(range(len(cols)), key=lambda i: (-cols[i], i)):
        kept = cols[i] - (len(ctx_ids[i]) - p) + 1  # candidate nodes + last context token
        if cur and (len(cur) >= batch_size or (n_kept + kept) * vocab > LOGITS_BUDGET):
            out.append(cur)
            cur, n_kept = [], 0
        cur.append(i)
        n_kept += kept
    if cur:
        out.append(cur)
    return out


def _run_packed(lm, caps, prefix, ctx_ids, cont_ids, bar, rows: list[int]) -> dict:
    """One forward for the items ``rows`` packed into dense rows (:mod:`.packing`)."""
    pack = pack_items(len(prefix), [ctx_ids[i] for i in rows], [cont_ids[i] for i in rows],
                      pad_id=lm.tokenizer.pad_token_id)
    dev = lm.device
    n_rows = pack.input_ids.shape[0]
    allowed = pack.allowed
    if prefix.detached:  # the rows' own columns only; the prefix is attended to outside
        allowed, cache = allowed[:, :, len(prefix):], new_cache(lm, caps)
    else:
        cache = fork_cache(prefix.cache, expand=n_rows) if len(prefix) else new_cache(lm, caps)
    keep = pack.keep.to(dev)
    kpos = packed_key_positions(pack.position_ids, allowed.shape[2] - pack.position_ids.shape[1])
    attn = model_mask(lm, allowed, caps=caps, qpos=pack.position_ids, kpos=kpos, device=dev)
    logits = forward(lm, pack.input_ids.to(dev), attn,
                     pack.position_ids.to(dev), cache, logits_to_keep=keep, prefix=prefix)
    if logits.dim() != 2 or logits.shape[0] != int(pack.keep.sum()):
        raise _PackedUnsupported()
    logits = logits.float()                                      # [K, V]
    lse = torch.logsumexp(logits, dim=-1)
    best = logits.argmax(dim=-1)
    col, tgt = pack.gather_col.to(dev), pack.gather_tgt.to(dev)
    lp = (logits[col, tgt] - lse[col]).double().cpu()
    miss = (best[col] != tgt).long().cpu()
    n = len(pack.cand_index)
    sums = torch.zeros(n, dtype=torch.float64).index_add_(0, pack.gather_cand, lp)
    misses = torch.zeros(n, dtype=torch.long).index_add_(0, pack.gather_cand, miss)
    ll = {bj: float(sums[k]) for k, bj in enumerate(pack.cand_index)}
    greedy = {bj: int(misses[k]) == 0 for k, bj in enumerate(pack.cand_index)}
    res = _results(rows, cont_ids, ll, greedy)
    bar.update(len(rows))
    return res


def _run_fork(lm, caps, prefix, ctx_ids, cont_ids, bar, batch_size: int, rows: list[int]) -> dict:
    """Prefill the contexts of ``rows`` once, then score the candidates as right-padded rows
    over the prefilled cache (forked, rows repeated per candidate), in length-sorted chunks
    of ``batch_size`` candidate rows."""
    dev = lm.device
    cache, mask, last = prefill(lm, prefix, [ctx_ids[i] for i in rows], caps)
    first_logp = log_probs(last).cpu()
    first_best = first_logp.argmax(dim=-1).tolist()
    pairs = [(b, j) for b, i in enumerate(rows) for j in range(len(cont_ids[i]))]
    ll, greedy = {}, {}
    # first candidate token: from the context's last position
    for b, j in pairs:
        t = cont_ids[rows[b]][j][0]
        ll[(b, j)] = float(first_logp[b, t])
        greedy[(b, j)] = first_best[b] == t
    longer = [p for p in pairs if len(cont_ids[rows[p[0]]][p[1]]) > 1]
    longer.sort(key=lambda p: -len(cont_ids[rows[p[0]]][p[1]]))  # little padding per chunk
    for chunk in chunks(longer, batch_size):
        conts = [cont_ids[rows[b]][j] for b, j in chunk]
        width = max(len(c) for c in conts) - 1  # inputs: all but the last token
        inp = torch.full((len(chunk), width), lm.tokenizer.pad_token_id, dtype=torch.long)
        cmask = torch.zeros((len(chunk), width), dtype=torch.long)
        tgt = torch.zeros((len(chunk), width), dtype=torch.long)
        for k, c in enumerate(conts):
            inp[k, :len(c) - 1] = torch.tensor(c[:-1])
            cmask[k, :len(c) - 1] = 1
            tgt[k, :len(c) - 1] = torch.tensor(c[1:])
        sel = torch.tensor([b for b, _ in chunk], dtype=torch.long, device=dev)
        full_mask = torch.cat([mask.index_select(0, sel), cmask.to(dev)], dim=1)
        pos = positions(full_mask, width, prefix.offset)
        logits = forward(lm, inp.to(dev), full_mask, pos, fork_cache(cache, rows=sel),
                         prefix=prefix)
        logp = log_probs(logits)
        lp, hit = _token_stats(logp, tgt.to(dev))
        lp, hit = lp.cpu(), hit.cpu()
        for k, p in enumerate(chunk):
            n = len(conts[k]) - 1
            ll[p] += float(lp[k, :n].double().sum())
            greedy[p] = greedy[p] and bool(hit[k, :n].all())
    res = _results(rows, cont_ids, ll, greedy)
    bar.update(len(rows))
    return res


def score_candidates_plain(lm, contexts: list[str], candidates: list[list[str]], *,
                           batch_size: int = 16, progress=None) -> list[list[CandidateScore]]:
    """Reference scorer: a full forward over context+candidate for every candidate (left-padded
    batches of ``batch_size`` sequences; no shared prefix, no cache reuse)."""
    ctx_ids, cont_ids = _encode(lm, contexts, candidates)
    seqs = [(i, j) for i in range(len(contexts)) for j in range(len(cont_ids[i]))]
    results: dict[tuple[int, int], CandidateScore] = {}
    dev = lm.device
    bar = Progress(progress, len(seqs), "score (plain)")
    try:
        with torch.inference_mode():
            def run(rows: list[int]) -> dict:
                pairs = [seqs[r] for r in rows]
                full = [ctx_ids[i] + cont_ids[i][j] for i, j in pairs]
                width = max(len(f) for f in full)
                keep = max(len(cont_ids[i][j]) for i, j in pairs)
                inp = torch.full((len(full), width), lm.tokenizer.pad_token_id, dtype=torch.long)
                mask = torch.zeros_like(inp)
                for k, f in enumerate(full):
                    inp[k, width - len(f):] = torch.tensor(f)
                    mask[k, width - len(f):] = 1
                inp, mask = inp.to(dev), mask.to(dev)
                logits = forward(lm, inp, mask, positions(mask, width), new_cache(lm),
                                 logits_to_keep=keep + 1)
                # logits[:, q] predicts token at absolute position width - keep - 1 + q + 1
                logp = log_probs(logits[:, :-1])  # predicts the last `keep` tokens
                res = {}
                for k, (i, j) in enumerate(pairs):
                    c = cont_ids[i][j]
                    rows_lp = logp[k, keep - len(c):]
                    lp, hit = _token_stats(rows_lp, torch.tensor(c, device=dev))
                    res[rows[k]] = CandidateScore(loglik=float(lp.double().sum()), n_tokens=len(c),
                                                  is_greedy=bool(hit.all()))
                bar.update(len(rows))
                return res

            for rows in length_batches([len(ctx_ids[i]) + len(cont_ids[i][j]) for i, j in seqs],
                                       batch_size):
                done = run_with_oom_fallback(rows, run, what="log-likelihood scoring (plain)",
                                             device=lm.info["device"],
                                             n_tokens=lambda rs: sum(len(ctx_ids[seqs[r][0]]) for r in rs))
                for r, sc in done.items():
                    results[seqs[r]] = sc
    finally:
        bar.close()
    out = []
    for i in range(len(contexts)):
        scores = [results[(i, j)] for j in range(len(cont_ids[i]))]
        check_finite([s.loglik for s in scores], i)
        out.append(scores)
    return out
