"""The temperature sampler (``safetyrepro.inference.sampling._Sampler``).

On a CPU with ``top_p == 1`` rows are drawn one at a time with a two-level cumulative sum
(``_draw_rows``); elsewhere the whole batch at once (``_draw_batch``). Both are inverse-CDF
draws of softmax(logits / T) with one uniform per row from the row's own generator. These
tests check the row path against an independent float64 computation with the same uniforms,
the drawn frequencies against the distribution, block and vocabulary edges, and that the
forward pass's ``select`` (logits at chosen positions only) equals indexing the full logits.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from safetyrepro.inference.sampling import EXP_FLOOR, NonFiniteLogits, _Sampler
from safetyrepro.inference.cache import new_cache
from safetyrepro.inference.prefill import forward

from numerics import assert_within, decide, gamma, matmul_bound, unit_roundoff

pytestmark = pytest.mark.numerics

PROMPTS = [f"prompt {i}" for i in range(400)]


def _reference(logits: torch.Tensor, temperature: float, u: torch.Tensor) -> list[int]:
    """Inverse CDF in float64 numpy from the same exponentials the sampler computes."""
    out = []
    for row, ur in zip(logits.float(), u.tolist()):
        x = row.clone()
        e = x.sub_(x.max()).mul_(1.0 / temperature).exp_().double().numpy()
        cdf = np.cumsum(e)
        out.append(min(int(np.searchsorted(cdf, ur * cdf[-1], side="left")), len(e) - 1))
    return out


def _exp_tol(logits: torch.Tensor, temperature: float) -> float:
    """How far two float32 computations of the normalised weights exp((x - max) / T) of a row
    may put its cumulative probabilities apart: each weight's argument (at most the row's
    spread / T, or the exponent floor) is rounded once (u relative), which moves the weight by
    that many u; exp and the normalisation round once more each."""
    u = unit_roundoff(torch.float32)
    spread = float((logits.float().amax(-1) - logits.float().amin(-1)).max()) / temperature
    return 2 * (min(spread, abs(EXP_FLOOR)) * 2 * u + 3 * u)


def _assert_draws_agree(got, want, logits, temperature, u, cdf_tol, what):
    """Draws computed with cumulative sums in another order or precision agree except where
    the uniform lies within ``cdf_tol`` of an end of the drawn token's CDF interval (the rule
    of tests/numerics.py, with the logits themselves equal)."""
    parted = 0
    for j, (a, b) in enumerate(zip(got, want)):
        if a != b:
            d = decide(logits[j], temperature, 1.0, float(u[j]), b)
            assert d.fragile(0.0, cdf_tol), (what, j, a, b, d)
            parted += 1
    return parted


@pytest.mark.parametrize("vocab", [1024, 3000, 151936])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_row_draws_equal_a_float64_inverse_cdf(vocab, dtype):
    g = torch.Generator().manual_seed(vocab)
    n = 64 if vocab > 10_000 else 400
    # peaked rows like a language model's (a few likely tokens over a long flat tail)
    logits = torch.randn((n, vocab), generator=g) * 2
    top = torch.randint(0, vocab, (n, 5), generator=g)
    logits.scatter_(1, top, torch.rand((n, 5), generator=g) * 6 + 8)
    logits = logits.to(dtype)
    active = list(range(n))
    got = _Sampler(0.7, 1.0, 3, PROMPTS[:n])._draw_rows(logits, active)
    u = _Sampler(0.7, 1.0, 3, PROMPTS[:n])._uniforms(active)   # the same generators, fresh
    want = _reference(logits, 0.7, u)
    assert got.dtype == torch.long
    # the same float32 exponentials summed in float64 in another order (blocks, then within)
    _assert_draws_agree(got.tolist(), want, logits, 0.7, u, 2 * gamma(vocab, torch.float64), "rows")
    # the batch version sums in float32 (softmax, then one cumulative sum over the vocabulary)
    batch = _Sampler(0.7, 1.0, 3, PROMPTS[:n])._draw_batch(logits, active)
    _assert_draws_agree(batch.tolist(), got.tolist(), logits, 0.7, u,
                        2 * gamma(vocab, torch.float32) + _exp_tol(logits, 0.7), "batch")


def test_row_draws_on_a_wide_spread_vocabulary_equal_the_unclamped_draws():
    """At T=0.3 a language model's logits put most of the vocabulary below exp(-87) after the
    shift, where float32 exponentials turn subnormal (slow on x86); the sampler clamps there
    (``EXP_FLOOR``). The draws must equal those of the unclamped exponentials (float64, exact
    for these tiny weights) on the same uniforms, up to the float64 summation order."""
    vocab, n, t = 262144, 24, 0.3
    g = torch.Generator().manual_seed(11)
    logits = torch.randn((n, vocab), generator=g) * 3 - 40            # a long low tail
    top = torch.randint(0, vocab, (n, 40), generator=g)
    logits.scatter_(1, top, torch.rand((n, 40), generator=g) * 12)    # a few dozen likely ones
    logits = logits.bfloat16()
    shifted = (logits.float() - logits.float().amax(1, keepdim=True)) / t
    assert float((shifted < EXP_FLOOR).float().mean()) > 0.9            # the clamp is engaged
    active = list(range(n))
    got = _Sampler(t, 1.0, 5, PROMPTS[:n])._draw_rows(logits, active).tolist()
    u = _Sampler(t, 1.0, 5, PROMPTS[:n])._uniforms(active)
    want = []
    for row, ur in zip(shifted.double().numpy(), u.tolist()):
        cdf = np.cumsum(np.exp(row))                                  # no floor, no subnormals
        want.append(min(int(np.searchsorted(cdf, ur * cdf[-1], side="left")), vocab - 1))
    # the sampler's float32 exponentials against float64 ones, plus the float64 sums in another
    # order; the floor moves weights < 1.2e-38 of the top one's, invisible at that level
    cdf_tol = _exp_tol(logits, t) + 2 * gamma(vocab, torch.float64)
    _assert_draws_agree(got, want, logits, t, u, cdf_tol, "unclamped")


def test_row_draws_follow_the_distribution():
    vocab, n = 2500, 400
    logits = torch.full((vocab,), -30.0)
    likely = torch.tensor([0, 1023, 1024, 2047, 2048, vocab - 1])  # block edges and the last id
    logits[likely] = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, 1.2])
    probs = torch.softmax(logits.double() / 0.7, dim=0)
    counts = torch.zeros(vocab, dtype=torch.long)
    for rep in range(25):                                        # 10,000 draws
        s = _Sampler(0.7, 1.0, rep, PROMPTS[:n])
        tok = s._draw_rows(logits.expand(n, vocab), list(range(n)))
        counts += torch.bincount(tok, minlength=vocab)
    total = int(counts.sum())
    assert set(torch.nonzero(counts).flatten().tolist()) <= set(likely.tolist())
    expected = probs[likely] * total
    chi2 = float((((counts[likely] - expected) ** 2) / expected).sum())
    assert chi2 < 20.5, (chi2, counts[likely].tolist(), expected.tolist())  # 5 dof, p = 0.001


def test_row_draws_reach_the_last_token_and_skip_zero_mass():
    vocab = 1500                                   # the last block is partly padding
    logits = torch.full((3, vocab), -math.inf)
    logits[0, vocab - 1] = 0.0                     # all mass on the last id
    logits[1, 1023] = 0.0                          # all mass at a block's last position
    logits[2, 1024] = 0.0                          # all mass at a block's first position
    for rep in range(20):
        tok = _Sampler(1.0, 1.0, rep, PROMPTS[:3])._draw_rows(logits.clone(), [0, 1, 2])
        assert tok.tolist() == [vocab - 1, 1023, 1024]


def test_cpu_top_p_one_takes_the_row_path_and_consumes_one_uniform_per_row():
    logits = torch.randn(4, 3000)
    a, b = _Sampler(0.3, 1.0, 0, PROMPTS[:4]), _Sampler(0.3, 1.0, 0, PROMPTS[:4])
    assert a(logits, [0, 1, 2, 3]).tolist() == b._draw_rows(logits, [0, 1, 2, 3]).tolist()
    # a row's generator advances by exactly one draw per step, whichever path drew it
    c = _Sampler(0.3, 1.0, 0, PROMPTS[:4])
    c._draw_batch(logits, [0, 1, 2, 3])
    assert a._uniforms([2]).tolist() == c._uniforms([2]).tolist()
    # nucleus sampling keeps the batch path
    nucleus = _Sampler(0.3, 0.9, 0, PROMPTS[:4])
    assert nucleus(logits, [0, 1, 2, 3]).tolist() == \
        _Sampler(0.3, 0.9, 0, PROMPTS[:4])._draw_batch(logits, [0, 1, 2, 3]).tolist()


def test_forward_select_equals_indexing_the_full_logits(smol_fp32):
    """The selected forward gathers the final hidden states and projects those rows only: the
    hidden states are the same arithmetic (equal bit for bit); the projection multiplies a
    [3, hidden] instead of a [10, hidden] matrix by the vocabulary matrix, which the GEMM
    library may block differently, so the logits agree within the length-hidden reduction's
    rounding bound (tests/numerics.py)."""
    lm = smol_fp32
    ids = torch.tensor([[1, 42, 7, 99, 5], [3, 8, 15, 16, 23]])
    mask = torch.ones_like(ids)
    pos = torch.arange(5).expand(2, 5)
    head = lm.model.get_output_embeddings()
    seen = []
    hook = head.register_forward_pre_hook(lambda mod, args: seen.append(args[0].detach().clone()))
    try:
        full = forward(lm, ids, mask, pos, new_cache(lm))
        rows, cols = torch.tensor([1, 0, 1]), torch.tensor([4, 2, 0])
        part = forward(lm, ids, mask, pos, new_cache(lm), select=(rows, cols))
    finally:
        hook.remove()
    assert part.shape == (3, full.shape[-1])
    hidden_full, hidden_again = seen   # this hook runs before the gathering one
    assert torch.equal(hidden_again, hidden_full)
    bound = matmul_bound(hidden_full[rows, cols], head.weight.T)
    assert_within(part, full[rows, cols], bound, "selected vs full logits")
    # the bound is far below what a wrong row would give
    assert float((part[0] - full[0, 2]).abs().max()) > 100 * float(bound.max())
    # the gathering hook is removed afterwards
    assert forward(lm, ids, mask, pos, new_cache(lm)).shape == full.shape


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_non_finite_logits_are_caught_by_the_row_sum_check(dtype, temperature):
    from safetyrepro.inference.sampling import NonFiniteLogits

    big = torch.finfo(dtype).max
    base = torch.randn(4, 1000).to(dtype)
    for bad, name in ((float("nan"), "nan"), (float("inf"), "inf"), (float("-inf"), "-inf")):
        logits = base.clone()
        logits[2, 17] = bad
        with pytest.raises(NonFiniteLogits) as err:
            _Sampler(temperature, 1.0, 3, PROMPTS[:4])(logits, [0, 1, 2, 3])
        assert err.value.prompt == PROMPTS[2] and str(err.value.value) == name
    both = base.clone()
    both[1, 3], both[1, 4] = float("inf"), float("-inf")      # their sum is NaN: still caught
    with pytest.raises(NonFiniteLogits):
        _Sampler(temperature, 1.0, 3, PROMPTS[:4])(both, [0, 1, 2, 3])
    # finite logits whose row sum overflows are not an error (the exact check clears them)
    huge = base.clone()
    huge[0, :8] = big
    assert not torch.isfinite(huge.sum(dim=-1)).all()
    assert _Sampler(temperature, 1.0, 3, PROMPTS[:4])(huge, [0, 1, 2, 3]).shape == (4,)


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_sequences_reading_one_logits_row_draw_as_with_their_own_copy(top_p):
    """Streams with equal histories read one logits row (``rows``); each must draw exactly
    what it draws from its own copy of that row: its own uniform, greedy rows their argmax,
    the row path (top_p 1) and the batch path (nucleus) alike, mixed temperatures too."""
    g = torch.Generator().manual_seed(5)
    logits = (torch.randn((3, 4000), generator=g) * 3).bfloat16()
    n = 8
    temps = [0.0, 0.3, 0.3, 0.7, 0.3, 0.7, 0.0, 0.7]
    rows = [0, 0, 0, 0, 1, 1, 2, 2]        # sequence j reads logits row rows[j]
    active = [7, 1, 2, 3, 4, 5, 6, 0]      # in an order other than the sampler's rows
    rows = [rows[r] for r in active]

    def sampler():
        return _Sampler(0.0, top_p, 0, PROMPTS[:n], seeds=list(range(n)),
                        temperatures=temps, top_ps=[top_p] * n)

    shared = sampler()(logits, active, rows).tolist()
    own = sampler()(logits.index_select(0, torch.tensor(rows)), active).tolist()
    assert shared == own
    assert shared[active.index(0)] == int(logits[rows[active.index(0)]].float().argmax())
    # a NaN in a shared row names the prompt of the first sequence reading it
    bad = logits.clone()
    bad[1, 7] = float("nan")
    with pytest.raises(NonFiniteLogits) as err:
        sampler()(bad, active, rows)
    assert err.value.prompt == PROMPTS[active[rows.index(1)]]
