"""Log-likelihood scoring of candidate continuations.

``loglik`` of a candidate is the sum over its tokens of ``log p(token | context, earlier
candidate tokens)`` (float32 log-softmax), with the tokenisation rule of
:func:`.encoding.encode_pair` (context and continuation encoded separately; trailing
spaces/tabs of the context moved to the continuation). ``is_greedy`` says whether every
candidate token is the model's argmax at its position (lm-evaluation-harness's "is_greedy").

:func:`score_candidates` (the engine path) runs each context ONCE: contexts are prefilled in
length-sorted, left-padded batches on top of the shared token prefix of all contexts
(:mod:`.kvcache`); the last context position's logits score every candidate's first token;
the prefilled cache is then forked with its rows repeated once per candidate, and all
candidates of the batch are run as right-padded continuations over it (in chunks of
``batch_size`` candidate rows) to score their remaining tokens. No context is recomputed per
candidate.

:func:`score_candidates_plain` is the reference: one full forward over context+candidate for
every candidate (batched, no prefix and no cache reuse). Both agree to float tolerance.

A non-finite log-likelihood raises CellError naming the item index (the caller adds the cell).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..errors import CellError
from .batching import Progress, chunks, length_batches, run_with_oom_fallback
from .encoding import encode_continuation, encode_prompt, split_trailing_space
from .kvcache import build_prefix, fork_cache, forward, new_cache, positions, prefill


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


def _token_stats(logp: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row target log-probs and argmax hits for log-prob matrix ``[..., V]``."""
    lp = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    hit = logp.argmax(dim=-1) == targets
    return lp, hit


def score_candidates(lm, contexts: list[str], candidates: list[list[str]], *,
                     batch_size: int = 16, progress=None,
                     prefix_cache: bool = True) -> list[list[CandidateScore]]:
    """Score ``candidates[i][j]`` as a continuation of ``contexts[i]`` with one context pass
    per item (see the module docstring). Returns scores in input order."""
    ctx_ids, cont_ids = _encode(lm, contexts, candidates)
    out: dict[int, list[CandidateScore]] = {}
    bar = Progress(progress, len(contexts), "score")
    dev = lm.device
    try:
        with torch.inference_mode():
            prefix = build_prefix(lm, ctx_ids, enabled=prefix_cache)

            def run(rows: list[int]) -> dict:
                cache, mask, last = prefill(lm, prefix, [ctx_ids[i] for i in rows])
                first_logp = torch.log_softmax(last, dim=-1).cpu()
                first_best = first_logp.argmax(dim=-1).tolist()
                pairs = [(b, j) for b, i in enumerate(rows) for j in range(len(cont_ids[i]))]
                ll, greedy = {}, {}
                # first candidate token: from the context's last position
                for b, j in pairs:
                    t = cont_ids[rows[b]][j][0]
                    ll[(b, j)] = float(first_logp[b, t])
                    greedy[(b, j)] = first_best[b] == t
                longer = [p for p in pairs if len(cont_ids[rows[p[0]]][p[1]]) > 1]
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
                    pos = positions(full_mask, width)
                    logits = forward(lm, inp.to(dev), full_mask, pos, fork_cache(cache, rows=sel))
                    logp = torch.log_softmax(logits.float(), dim=-1)
                    lp, hit = _token_stats(logp, tgt.to(dev))
                    lp, hit = lp.cpu(), hit.cpu()
                    for k, p in enumerate(chunk):
                        n = len(conts[k]) - 1
                        ll[p] += float(lp[k, :n].double().sum())
                        greedy[p] = greedy[p] and bool(hit[k, :n].all())
                res = {}
                for b, i in enumerate(rows):
                    scores = [CandidateScore(loglik=ll[(b, j)], n_tokens=len(cont_ids[i][j]),
                                             is_greedy=greedy[(b, j)])
                              for j in range(len(cont_ids[i]))]
                    check_finite([s.loglik for s in scores], i)
                    res[i] = scores
                bar.update(len(rows))
                return res

            for rows in length_batches([len(c) for c in ctx_ids], batch_size):
                out.update(run_with_oom_fallback(
                    rows, run, what="log-likelihood scoring", device=lm.info["device"],
                    n_tokens=lambda rs: sum(len(ctx_ids[i]) + sum(map(len, cont_ids[i])) for i in rs)))
    finally:
        bar.close()
    return [out[i] for i in range(len(contexts))]


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
                logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)  # predicts last `keep`
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
