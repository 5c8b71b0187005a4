"""lm-eval's HF model class with each context computed once per item.

lm-eval's own loop runs one full forward over context + continuation for every candidate,
which repeats a TruthfulQA preamble or a BBQ context once per option (docs/CROSS_PACKAGE.md,
"cost"). :class:`SharedContextHFLM` keeps everything of lm-eval's that defines the object
scored (task files, rendered requests, its tokenisation, its metrics) and replaces only that
loop: requests are grouped by context tokens and scored by
:func:`safetyrepro.inference.scoring.score_token_candidates`, returning per request what
lm-eval's loop returns (summed log-likelihood, ``is_greedy``). Log-softmax runs in float32;
requests longer than the model go through lm-eval's own loop (which truncates from the left).
"""

from __future__ import annotations

from lm_eval.models.huggingface import HFLM

from ..inference.prefill import MIN_PREFIX
from ..inference.scoring import score_token_candidates


class SharedContextHFLM(HFLM):
    """``HFLM`` over an already loaded :class:`~safetyrepro.models.load.LoadedModel` (``engine``),
    with the tokenizer lm-eval loads itself from ``tokenizer`` (the model folder)."""

    def __init__(self, engine, tokenizer: str, batch_size: int = 16, **kwargs):
        super().__init__(pretrained=engine.model, tokenizer=tokenizer, batch_size=batch_size, **kwargs)
        self.engine = engine

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, override_bs=None):
        too_long = [k for k, (_, c, x) in enumerate(requests) if len(c) + len(x) > self.max_length + 1]
        out: list = [None] * len(requests)
        if too_long:  # lm-eval's own loop truncates these from the left
            stock = super()._loglikelihood_tokens([requests[k] for k in too_long], disable_tqdm=True,
                                                  override_bs=override_bs)
            for k, ans in zip(too_long, stock):
                out[k] = ans
        skip = set(too_long)
        groups: dict[tuple, list[int]] = {}
        for k, (_, ctx, _) in enumerate(requests):
            if k not in skip:
                groups.setdefault(tuple(ctx), []).append(k)
        for ctxs in _clusters(list(groups)):
            scores = score_token_candidates(
                self.engine, [list(c) for c in ctxs], [[list(requests[k][2]) for k in groups[c]] for c in ctxs],
                batch_size=int(self.batch_size) if str(self.batch_size).isdigit() else 16)
            for c, sc in zip(ctxs, scores):
                for k, s in zip(groups[c], sc):
                    out[k] = (s.loglik, s.is_greedy)
        for (key, _, _), ans in zip(requests, out):
            self.cache_hook.add_partial("loglikelihood", key, ans)
        return out


def _clusters(ctxs: list[tuple]) -> list[list[tuple]]:
    """Contexts grouped so that each call of the scorer shares a prefix where one exists: those
    with the same first :data:`MIN_PREFIX` tokens together (one task's fixed preamble), all the
    rest in one call."""
    by_head: dict[tuple, list[tuple]] = {}
    for c in ctxs:
        by_head.setdefault(c[:MIN_PREFIX], []).append(c)
    shared = [g for g in by_head.values() if len(g) > 1]
    rest = [c for g in by_head.values() if len(g) == 1 for c in g]
    return shared + ([rest] if rest else [])
