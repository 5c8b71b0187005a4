"""How the tests compare floating-point results: one rule, written once, used everywhere.

1. **Same arithmetic, same order** (same kernel on the same shapes and inputs, a copy, a row
   selection): the results are bit-identical, and the tests compare them with equality.

2. **The same real computation in another order** (another blocking of a matrix product for
   another batch shape, a fused kernel against the written-out products, a batch against one
   item at a time): the results differ by rounding alone, and the tolerance is derived from
   the dtype's unit roundoff ``u`` (half its machine epsilon) and the length ``n`` of the
   reductions, never from what one CPU's kernels happened to give:

   * one reduction whose terms are at hand (a matrix product, one attention): the classic
     worst-case bound. A sum of ``n`` terms computed in any order lies within
     ``gamma_n * sum|terms|`` of the exact sum, ``gamma_n = n u / (1 - n u)`` (Higham,
     *Accuracy and Stability of Numerical Algorithms*, 2nd ed. 2002, Lemma 3.1 and eq. 3.5),
     so two evaluations differ by at most twice that (:func:`matmul_bound`,
     :func:`attention_bound`);
   * a whole model (hundreds of chained reductions whose terms are not at hand): the
     probabilistic bound of Higham & Mary ("A new approach to probabilistic rounding error
     analysis", SIAM J. Sci. Comput. 41(5), 2019): with rounding errors independent and of
     mean zero, a sum of ``n`` terms lies within ``lambda * sqrt(n) * u * sum|terms|`` of the
     exact one with probability at least ``1 - 2 n exp(-lambda^2 / 2)``. Chaining ``D``
     reductions of length at most ``n`` through layers that normalise their inputs (so no
     layer amplifies a relative error), a logit of magnitude up to ``M`` carries at most
     ``lambda * sqrt(n D) * u * M`` of rounding; two evaluations differ by at most twice that
     (:func:`model_logit_tol`). ``LAMBDA = 6`` puts the failure probability of one length-1536
     sum below 5e-5.
   * bf16 (values stored rounded to bf16, sums accumulated in fp32): a stored value carries
     one bf16 rounding per operation on its path. For one attention this enters
     :func:`attention_bound` directly; for a whole bf16 model the worst case is larger than
     the quantities compared, so a bf16 path is instead held to the rounding that bf16 itself
     causes on the same inputs: its distance from the fp32 result may not exceed twice the
     largest distance of the reference bf16 path from fp32 (:func:`bf16_tolerance`).

3. **Discrete outcomes computed from such results** (greedy tokens, sampled tokens) are
   compared exactly, except at a *fragile* decision: a greedy step whose top-2 logit margin in
   the reference is within ``2 tol`` (each logit may move by ``tol``), or a sampled step whose
   uniform lies within ``delta = exp(2 tol / T) - 1`` of an end of the drawn token's CDF
   interval or of the nucleus boundary (moving every logit by at most ``tol`` scales each
   cumulative probability by a factor within ``exp(+-2 tol / T)``). After a fragile step the
   two sequences go different ways and are not compared further; a divergence at a step that
   is not fragile fails the test. :class:`Trace` records every decision the engine's sampler
   takes (keyed by temperature, nucleus mass, seed and prompt, so the same sequence is found
   in any batch arrangement); :func:`assert_sequences_agree` applies the rule.
"""

from __future__ import annotations

import contextlib
import math
from collections import defaultdict
from dataclasses import dataclass, field

import torch

LAMBDA = 6.0


def unit_roundoff(dtype: torch.dtype) -> float:
    """u: half the machine epsilon (round to nearest)."""
    return torch.finfo(dtype).eps / 2


def gamma(n: int, dtype: torch.dtype) -> float:
    """Worst-case relative rounding of a length-n sum (Higham 2002, Lemma 3.1)."""
    nu = n * unit_roundoff(dtype)
    if nu >= 1:
        raise ValueError(f"gamma_{n} is undefined in {dtype}")
    return nu / (1 - nu)


def gamma_prob(n: int, dtype: torch.dtype, lam: float = LAMBDA) -> float:
    """Probabilistic relative rounding of a length-n sum (Higham & Mary 2019, Theorem 2.4)."""
    return lam * math.sqrt(n) * unit_roundoff(dtype)


# ---------------------------------------------------------------------------------------------
# bounds for one reduction (elementwise tensors)
# ---------------------------------------------------------------------------------------------
def matmul_bound(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Elementwise bound on the difference of two evaluations of ``a @ b`` in ``dtype`` that
    differ only in summation order: ``2 gamma_k (|a| @ |b|)``, k = the inner dimension."""
    k = a.shape[-1]
    return 2 * gamma(k, dtype) * (a.double().abs() @ b.double().abs())


def attention_bound(query, key, value, mask, scaling: float, *, storage: torch.dtype = torch.float32,
                    accumulate: torch.dtype = torch.float32, groups: int = 1) -> torch.Tensor:
    """Elementwise bound on the difference of two evaluations of one masked attention
    ``softmax(scaling q k^T) v`` that differ in order and kernel (tiled, fused, cascaded).

    query [b, hq, q, d], key/value [b, hkv, n, d], mask [b, 1, q, n] (True = attend),
    ``groups`` query heads per key/value head. Scores: two evaluations of a length-d sum
    differ by ``2 gamma_d |q||k|`` (plus one rounding of each stored score); a row whose scores
    move by at most E has probabilities moving by a factor within exp(+-2E), so the output
    moves by at most (exp(2E) - 1) sum_j p_j |v_j|; the normalising sum and the weighted sum
    over n keys add ``2 gamma_n``, stored probabilities and outputs one rounding each. All
    computed in float64 from the exact inputs. Returns [b, q, hq, d] like the attention."""
    q, k, v = query.double(), key.double(), value.double()
    if groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    d, n = q.shape[-1], k.shape[-2]
    us, ga_d, ga_n = unit_roundoff(storage), gamma(d, accumulate), gamma(n, accumulate)
    s = scaling * q @ k.transpose(-1, -2)
    s_abs = scaling * q.abs() @ k.abs().transpose(-1, -2)
    m = mask.bool().expand(s.shape)
    err_s = 2 * (ga_d * s_abs + us * s.abs())
    e = torch.where(m, err_s, torch.zeros_like(err_s)).amax(-1, keepdim=True)
    p = torch.softmax(s.masked_fill(~m, -math.inf), dim=-1).nan_to_num(0.0)
    weighted = p @ v.abs()
    out = p @ v
    bound = (torch.expm1(2 * e) + 2 * (2 * ga_n + 2 * us)) * weighted + 2 * us * out.abs()
    return bound.transpose(1, 2)


def assert_within(got: torch.Tensor, want: torch.Tensor, bound, what: str = "") -> None:
    """|got - want| <= bound elementwise (bound: a tensor or a number)."""
    diff = (got.double() - want.double()).abs()
    bound = torch.as_tensor(bound, dtype=torch.float64).expand_as(diff)
    bad = diff > bound
    if bool(bad.any()):
        idx = tuple(int(i) for i in bad.nonzero()[0])
        raise AssertionError(
            f"{what or 'values'} differ beyond the rounding bound at {int(bad.sum())} of {diff.numel()} "
            f"elements; first at {idx}: |diff| = {float(diff[idx]):.3g} > bound {float(bound[idx]):.3g} "
            f"(largest diff/bound ratio {float((diff / bound.clamp_min(1e-300)).max()):.3g})")


# ---------------------------------------------------------------------------------------------
# whole models
# ---------------------------------------------------------------------------------------------
REDUCTIONS_PER_BLOCK = 6   # q/k/v projection, scores, weighted values, output projection, MLP in, MLP out


def model_depth_and_width(lm) -> tuple[int, int]:
    """(D, n): the number of chained reductions from the embeddings to a logit, and the longest
    reduction length among them (hidden and intermediate sizes)."""
    cfg = lm.model.config.get_text_config()
    layers = int(cfg.num_hidden_layers)
    width = max(int(cfg.hidden_size), int(getattr(cfg, "intermediate_size", 0) or 0))
    return REDUCTIONS_PER_BLOCK * layers + 1, width


def model_rel_tol(lm, dtype: torch.dtype = torch.float32) -> float:
    """Relative bound on the difference of two evaluations of a logit (see the module text):
    ``2 lambda sqrt(n D) u``; multiply by the logits' magnitude."""
    depth, width = model_depth_and_width(lm)
    return 2 * gamma_prob(width * depth, dtype)


def model_logit_tol(lm, magnitude: float, dtype: torch.dtype = torch.float32) -> float:
    return model_rel_tol(lm, dtype) * float(magnitude)


def logit_magnitude(lm, texts: list[str]) -> float:
    """The largest |logit| a plain forward of each text gives anywhere (the M of the rule)."""
    from safetyrepro.inference import encode_prompt

    m = 0.0
    with torch.inference_mode():
        for t in texts:
            ids = torch.tensor([encode_prompt(lm.tokenizer, t)])
            m = max(m, float(lm.model(input_ids=ids).logits.float().abs().max()))
    return m


def loglik_tol(lm, n_tokens: int, magnitude: float) -> float:
    """A candidate's log-likelihood sums n_tokens log-probabilities, each a logit minus a
    log-sum-exp of logits; each term moves by at most twice the logit bound."""
    return 2 * n_tokens * model_logit_tol(lm, magnitude)


def bf16_tolerance(plain_bf16: list[float], fp32: list[float]) -> float:
    """Twice the largest distance of the reference bf16 results from their fp32 values: the
    rounding bf16 itself causes on these inputs (see the module text)."""
    return 2 * max(abs(a - b) for a, b in zip(plain_bf16, fp32))


# ---------------------------------------------------------------------------------------------
# decisions: greedy and sampled tokens
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Key:
    temperature: float
    top_p: float
    seed: int | None          # None for greedy rows (the seed does not enter a greedy choice)
    prompt: str


@dataclass
class Decision:
    token: int
    temperature: float
    scale: float              # max |logit| of the row
    margin: float = math.inf  # greedy: top-1 minus top-2 logit
    draw_gap: float = math.inf    # sampled: distance of the uniform to its token's CDF ends
    nucleus_gap: float = math.inf  # sampled with top_p < 1: distance of top_p to a cumulative mass

    def fragile(self, rel_tol: float, cdf_tol: float = 0.0) -> bool:
        """Could the choice change when every logit moves by ``rel_tol * scale`` and every
        cumulative probability by ``cdf_tol`` (the sampler's own sums)?"""
        tol = rel_tol * self.scale
        if self.temperature == 0:
            return self.margin <= 2 * tol
        delta = math.expm1(2 * tol / self.temperature) + cdf_tol
        return min(self.draw_gap, self.nucleus_gap) <= delta


def decide(row: torch.Tensor, temperature: float, top_p: float, u: float | None, token: int) -> Decision:
    """The decision the sampler took on one logits row, with how close it was to going another
    way (computed in float64)."""
    x = row.detach().double().flatten()
    scale = float(x.abs().max())
    if temperature == 0:
        top = torch.topk(x, 2).values if x.numel() > 1 else torch.cat([x, x.new_tensor([-math.inf])])
        return Decision(token, 0.0, scale, margin=float(top[0] - top[1]))
    w = torch.exp((x - x.max()) / temperature)
    p = w / w.sum()
    nucleus_gap = math.inf
    if top_p < 1.0:
        ps, order = p.sort(descending=True)
        before = ps.cumsum(0) - ps
        nucleus_gap = float((before - top_p).abs().min())
        kept = before < top_p
        ps, order = ps[kept], order[kept]
        cdf = ps.cumsum(0) / ps.sum()
        where = (order == token).nonzero()
    else:
        cdf = p.cumsum(0)
        cdf = cdf / cdf[-1]
        where = torch.tensor([[token]])
    if u is None or where.numel() == 0:
        return Decision(token, temperature, scale, draw_gap=0.0, nucleus_gap=nucleus_gap)
    i = int(where[0, 0])
    lo = float(cdf[i - 1]) if i > 0 else 0.0
    hi = float(cdf[i])
    gap = min(u - lo, hi - u) if lo <= u <= hi else 0.0
    return Decision(token, temperature, scale, draw_gap=gap, nucleus_gap=nucleus_gap)


@dataclass
class Sequence:
    key: Key
    decisions: list[Decision] = field(default_factory=list)

    @property
    def tokens(self) -> list[int]:
        return [d.token for d in self.decisions]


class Trace:
    """Every decision of the engine's sampler inside ``with trace.recording():``, per sequence.

    A sequence is recorded when its row makes its first decision: samplers built only to
    check arguments (``generate_streams`` builds one before any prompt is encoded) or rows
    that never decode leave nothing behind, so a count of ``sequences`` is a count of the
    sequences actually decoded."""

    def __init__(self):
        self.sequences: dict[Key, list[Sequence]] = defaultdict(list)

    def record(self, seq: Sequence) -> None:
        self.sequences[seq.key].append(seq)

    def get(self, temperature: float, prompt: str, seed: int | None = None, top_p: float = 1.0) -> list[Sequence]:
        key = Key(float(temperature), float(top_p) if temperature > 0 else 1.0,
                  int(seed) if temperature > 0 else None, prompt)
        return self.sequences.get(key, [])

    @contextlib.contextmanager
    def recording(self):
        from safetyrepro.inference.sampling import _Sampler

        init, call, uniforms = _Sampler.__init__, _Sampler.__call__, _Sampler._uniforms
        trace = self

        def init_w(self, temperature, top_p, seed, prompts, seeds=None, **kw):
            init(self, temperature, top_p, seed, prompts, seeds, **kw)
            row_seeds = seeds if seeds is not None else [seed] * len(prompts)
            self._trace_seqs = [
                Sequence(Key(t, p if t > 0 else 1.0, int(s) if t > 0 else None, pr))
                for t, p, s, pr in zip(self.temps, self.top_ps, row_seeds, prompts)]

        def uniforms_w(self, active):
            u = uniforms(self, active)
            if getattr(self, "_trace_u", None) is not None:
                self._trace_u.update(zip(active, u.tolist()))
            return u

        def call_w(self, logits, active, rows=None):
            self._trace_u = {}
            rows = list(range(len(active))) if rows is None else rows
            try:
                tokens = call(self, logits, active, rows)
                for j, r in enumerate(active):
                    if not self._trace_seqs[r].decisions:
                        trace.record(self._trace_seqs[r])
                    self._trace_seqs[r].decisions.append(
                        decide(logits[rows[j]], self.temps[r], self.top_ps[r], self._trace_u.get(r),
                               int(tokens[j])))
            finally:
                self._trace_u = None
            return tokens

        _Sampler.__init__, _Sampler.__call__, _Sampler._uniforms = init_w, call_w, uniforms_w
        try:
            yield self
        finally:
            _Sampler.__init__, _Sampler.__call__, _Sampler._uniforms = init, call, uniforms


def agree(got: list[int], want: Sequence, rel_tol: float, cdf_tol: float = 0.0, what: str = "") -> bool:
    """``got`` must equal ``want``'s tokens up to its first fragile decision. Returns True when
    the whole sequences are equal, False when they part at a fragile decision; raises when
    they part anywhere else."""
    ref = want.tokens
    for step, (a, b) in enumerate(zip(got, ref)):
        if a != b:
            d = want.decisions[step]
            if d.fragile(rel_tol, cdf_tol):
                return False
            raise AssertionError(
                f"{what or want.key}: token {a} instead of {b} at step {step}, where the reference "
                f"decision was not fragile (greedy margin {d.margin:.3g}, draw gap {d.draw_gap:.3g}, "
                f"nucleus gap {d.nucleus_gap:.3g}; logit tolerance {rel_tol * d.scale:.3g})")
    if len(got) != len(ref):
        raise AssertionError(f"{what or want.key}: {len(got)} tokens instead of {len(ref)} "
                             f"with equal tokens up to the shorter ({got} vs {ref})")
    return True


def assert_sequences_agree(got: Trace, want: Trace, rel_tol: float, cdf_tol: float = 0.0) -> set[Key]:
    """Every sequence of ``want`` is in ``got`` (matched by key, duplicates in order) and agrees
    with it under the rule (module text). Returns the keys of the sequences that parted at a
    fragile decision, so a test can skip what only equal sequences must share."""
    parted = set()
    for key, refs in want.sequences.items():
        gots = got.sequences.get(key, [])
        assert len(gots) == len(refs), f"{key}: {len(gots)} sequence(s) recorded, {len(refs)} expected"
        for g, w in zip(gots, refs):
            if not agree(g.tokens, w, rel_tol, cdf_tol, what=str(key)):
                parted.add(key)
    return parted


def reference_decisions(scores, tokens: list[int]) -> list[Decision]:
    """Greedy decisions from transformers' per-step scores (``output_scores=True``)."""
    return [decide(s[0], 0.0, 1.0, None, t) for s, t in zip(scores, tokens)]
