"""The comparison rule of tests/numerics.py on cases computed by hand and on real reorderings."""

from __future__ import annotations

import math

import pytest
import torch

from numerics import (Decision, Key, Sequence, agree, assert_within, attention_bound, decide, gamma,
                      gamma_prob, matmul_bound, unit_roundoff)

pytestmark = pytest.mark.numerics


def test_gamma_and_unit_roundoff_by_hand():
    assert unit_roundoff(torch.float32) == 2.0 ** -24
    assert unit_roundoff(torch.bfloat16) == 2.0 ** -8
    u = 2.0 ** -24
    assert gamma(576, torch.float32) == pytest.approx(576 * u / (1 - 576 * u), rel=1e-12)
    assert gamma_prob(1536, torch.float32, lam=6) == pytest.approx(6 * math.sqrt(1536) * u, rel=1e-12)
    with pytest.raises(ValueError):
        gamma(2 ** 24, torch.float32)


def test_matmul_bound_covers_another_blocking_and_not_another_product():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(7, 4096, generator=g), torch.randn(4096, 33, generator=g)
    plain = a @ b
    # the same product summed in 64 blocks of 64, one block at a time: another order
    blocked = sum(a[:, i:i + 64] @ b[i:i + 64] for i in range(0, 4096, 64))
    # and strictly sequentially in float32 (the worst order for rounding)
    seq = torch.zeros(7, 33)
    for i in range(4096):
        seq += a[:, i:i + 1] * b[i:i + 1]
    bound = matmul_bound(a, b)
    assert_within(blocked, plain, bound)
    assert_within(seq, plain, bound)
    # the worst case grows with k (here about 2 gamma_4096 * 4096 * E|a||b| = 1.3), and still one
    # input changed by a few standard deviations is caught
    a2 = a.clone()
    a2[0, 0] += 5.0
    with pytest.raises(AssertionError, match="rounding bound"):
        assert_within(a2 @ b, plain, bound)


def test_attention_bound_covers_a_chunked_evaluation():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 3, 4, 16, generator=g) for _ in range(3))
    k, v = torch.randn(2, 3, 50, 16, generator=g), torch.randn(2, 3, 50, 16, generator=g)
    mask = torch.ones(2, 1, 4, 50, dtype=torch.bool)
    mask[:, :, :, 40:] = False
    s = (q @ k.transpose(-1, -2)) * 0.25
    want = torch.softmax(s.masked_fill(~mask, -math.inf), -1) @ v
    # the same attention as two chunks merged through their log-sum-exps
    parts = []
    for lo, hi in ((0, 17), (17, 40)):
        sc = s[..., lo:hi]
        m = sc.amax(-1, keepdim=True)
        w = torch.exp(sc - m)
        parts.append((m + torch.log(w.sum(-1, keepdim=True)), (w / w.sum(-1, keepdim=True)) @ v[..., lo:hi, :]))
    lse = torch.logsumexp(torch.cat([p[0] for p in parts], -1), -1, keepdim=True)
    got = sum(torch.exp(p[0] - lse) * p[1] for p in parts)
    bound = attention_bound(q, k, v, mask, 0.25)
    assert_within(got.transpose(1, 2), want.transpose(1, 2), bound)
    # attending to the masked keys as well is not rounding
    leak = torch.softmax(s, -1) @ v
    assert float(((leak - want).abs().transpose(1, 2) / bound).max()) > 100


def test_greedy_decision_is_fragile_only_inside_twice_the_tolerance():
    row = torch.tensor([10.0, 9.99, 2.0, -3.0])
    d = decide(row, 0.0, 1.0, None, 0)
    assert d.margin == pytest.approx(0.01, abs=1e-6) and d.scale == 10.0
    assert d.fragile(rel_tol=0.0006)        # tolerance 0.006: margin 0.01 <= 0.012
    assert not d.fragile(rel_tol=0.0004)    # tolerance 0.004: margin 0.01 > 0.008


def test_sampled_decision_gap_by_hand():
    # T = 1, logits log(1), log(2), log(1): probabilities 1/4, 1/2, 1/4; CDF 0.25, 0.75, 1
    row = torch.log(torch.tensor([1.0, 2.0, 1.0]))
    d = decide(row, 1.0, 1.0, 0.3, 1)
    assert d.draw_gap == pytest.approx(0.05) and d.nucleus_gap == math.inf
    # every logit moving by tol changes each cumulative probability by a factor exp(+-2 tol)
    tol = math.log1p(0.05) / 2 / d.scale
    assert d.fragile(rel_tol=tol * 1.001) and not d.fragile(rel_tol=tol * 0.999)
    # a uniform outside the drawn token's interval is fragile by definition (distance 0)
    assert decide(row, 1.0, 1.0, 0.9, 1).draw_gap == 0.0
    # nucleus: sorted masses 1/2, 1/4, 1/4, mass before each 0, 1/2, 3/4; top_p = 0.7 is 0.05
    # from 3/4; within the nucleus (1/2, 1/4 renormalised: CDF 2/3, 1) u = 0.5 draws token 1
    d = decide(row, 1.0, 0.7, 0.5, 1)
    assert d.nucleus_gap == pytest.approx(0.05) and d.draw_gap == pytest.approx(2 / 3 - 0.5)


def test_agree_stops_at_a_fragile_step_and_fails_elsewhere():
    key = Key(0.0, 1.0, None, "p")
    firm, shaky = Decision(5, 0.0, 10.0, margin=3.0), Decision(6, 0.0, 10.0, margin=1e-4)
    ref = Sequence(key, [firm, shaky, firm])
    assert agree([5, 6, 5], ref, rel_tol=1e-4)
    assert agree([5, 7, 1], ref, rel_tol=1e-4) is False       # parted where the margin was tiny
    with pytest.raises(AssertionError, match="not fragile"):
        agree([4, 6, 5], ref, rel_tol=1e-4)                    # parted at a firm step
    with pytest.raises(AssertionError, match="tokens instead of"):
        agree([5, 6], ref, rel_tol=1e-4)
