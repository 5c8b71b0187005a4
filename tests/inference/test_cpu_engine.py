"""The engine's changes to the model itself, each against the path it replaces:

* engine attention (:mod:`safetyrepro.inference.attention`) against transformers' own ``sdpa``
  function, on random tensors and on the real SmolLM2's generations and scores;
* grouped heads without key/value copies (``sdpa_grouped``, and the engine's attention
  outside a shared prefix) against transformers' ``sdpa``, which copies them, on random
  tensors and on the decode groups of the real SmolLM2 and Qwen2.5-0.5B;
* NF4 layers dequantised once at load (:mod:`safetyrepro.models.nf4`) against bitsandbytes'
  generic CPU path (dequantise, then bf16 linear), bit for bit."""

from __future__ import annotations

import contextlib
import types

import pytest
import torch

from safetyrepro.inference import generate, generate_multi_seed, score_candidates
from safetyrepro.inference import attention
from safetyrepro.inference.attention import (GROUPED, NAME, NAME_REPEAT, engine_attention,
                                             engine_attention_repeat, grouped_attention,
                                             shared_prefix)
from safetyrepro.inference.capabilities import Capabilities
from safetyrepro.models import format_prompt, load_model

from numerics import (Trace, assert_sequences_agree, assert_within, attention_bound, logit_magnitude,
                      loglik_tol, model_rel_tol)

pytestmark = pytest.mark.numerics

KEY = "smollm2-135m"


def _stock(module, q, k, v, mask):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    return sdpa_attention_forward(module, q, k, v, mask, scaling=module.scaling)[0]


class _Prefix:
    """What the attention reads of a detached prefix: per layer [kv heads, P, head dim]."""

    def __init__(self, keys, values):
        self.keys, self.values = keys, values

    def kv(self, layer_idx):
        return self.keys.float(), self.values.float()


def _bound(module, q, k, v, mask, storage=torch.float32):
    """The rounding bound of tests/numerics.py for this attention (two evaluations in another
    order and kernel: engine cascade, fused kernel, sdpa)."""
    return attention_bound(q, k, v, mask, module.scaling, storage=storage,
                           groups=module.num_key_value_groups)


def _case(b, hkv, groups, q, p, own, d=16, dtype=torch.float32, seed=0):
    """A shared prefix of ``p`` columns, each row's ``own`` columns with left padding that
    differs per row, and the same attention written out in full for transformers' sdpa."""
    g = torch.Generator().manual_seed(seed)
    hq = hkv * groups
    query = torch.randn(b, hq, q, d, generator=g).to(dtype)
    kp, vp = (torch.randn(hkv, p, d, generator=g).to(dtype) for _ in range(2))
    key, value = (torch.randn(b, hkv, own, d, generator=g).to(dtype) for _ in range(2))
    mask = torch.zeros(b, 1, q, own, dtype=torch.bool)
    for r in range(b):
        pads = r % 3
        for i in range(q):
            mask[r, 0, i, pads:pads + 1 + (own - pads - q) + i] = True
    full_k = torch.cat([kp[None].expand(b, -1, -1, -1), key], dim=2)
    full_v = torch.cat([vp[None].expand(b, -1, -1, -1), value], dim=2)
    full_mask = torch.cat([torch.ones(b, 1, q, p, dtype=torch.bool), mask], dim=3)
    module = types.SimpleNamespace(num_key_value_groups=groups, scaling=d ** -0.5, training=False,
                                   is_causal=True, layer_idx=0)
    return module, query, key, value, mask, _Prefix(kp, vp), (full_k, full_v, full_mask)


@pytest.mark.parametrize("b,hkv,groups,q,p,own", [
    (4, 3, 3, 1, 40, 9),     # plain decode step: one query per row
    (3, 3, 3, 5, 40, 20),    # stream columns: five queries per row
    (2, 2, 7, 12, 25, 30),   # prefill of a packed row (Qwen-like grouping)
    (2, 1, 4, 3, 10, 8),     # one key/value head (Gemma-like grouping)
])
def test_engine_attention_with_a_detached_prefix_equals_sdpa_fp32(b, hkv, groups, q, p, own):
    module, query, key, value, mask, prefix, (fk, fv, fm) = _case(b, hkv, groups, q, p, own)
    want = _stock(module, query, fk, fv, fm)
    with shared_prefix(prefix):
        got, _ = engine_attention(module, query, key, value, mask, scaling=module.scaling)
    assert got.shape == want.shape == (b, q, hkv * groups, 16)
    bound = _bound(module, query, fk, fv, fm)
    assert_within(got, want, bound, "engine vs sdpa")
    # an additive float mask (the eager convention) gives the same result
    additive = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    with shared_prefix(prefix):
        got_add, _ = engine_attention(module, query, key, value, additive, scaling=module.scaling)
    assert_within(got_add, want, bound, "engine (additive mask) vs sdpa")
    # the bound has teeth: leaving out the shared prefix moves every output far beyond it
    without = _stock(module, query, key, value, mask)
    assert bool(((without - want).abs().amax(-1) > 100 * bound.amax(-1)).all())


@pytest.mark.parametrize("b,hkv,groups,q,p,own", [
    (4, 3, 3, 1, 40, 9), (3, 3, 3, 5, 40, 20), (2, 2, 7, 12, 25, 30), (2, 1, 4, 3, 10, 8)])
def test_prefix_part_in_the_fused_kernel_equals_the_plain_products_and_sdpa(b, hkv, groups, q, p, own,
                                                                            monkeypatch):
    """Large prefix parts (>= FUSED_MIN_SCORES scores) run in torch's fused CPU kernel; with the
    threshold at 0 and at infinity both versions must equal sdpa over the written-out columns,
    also for a query that may see none of its own columns (only the prefix counts there)."""
    if attention._flash_cpu() is None:
        pytest.fail("this torch has no fused CPU attention kernel returning the log-sum-exp")
    module, query, key, value, mask, prefix, (fk, fv, fm) = _case(b, hkv, groups, q, p, own)
    mask[0, 0, 0, :] = False
    fm = torch.cat([torch.ones(b, 1, q, p, dtype=torch.bool), mask], dim=3)
    want = _stock(module, query, fk, fv, fm)
    for threshold in (0, float("inf")):
        monkeypatch.setattr(attention, "FUSED_MIN_SCORES", threshold)
        with shared_prefix(prefix):
            got, _ = engine_attention(module, query, key, value, mask, scaling=module.scaling)
        assert_within(got, want, _bound(module, query, fk, fv, fm), f"threshold {threshold}")


def test_engine_attention_without_a_mask_is_causal_over_the_own_columns():
    module, query, key, value, _, prefix, (fk, fv, _) = _case(2, 3, 3, 6, 20, 6)
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    fm = torch.cat([torch.ones(6, 20, dtype=torch.bool), causal], dim=1)[None, None].expand(2, 1, 6, 26)
    with shared_prefix(prefix):
        got, _ = engine_attention(module, query, key, value, None, scaling=module.scaling)
    assert_within(got, _stock(module, query, fk, fv, fm), _bound(module, query, fk, fv, fm))


def test_engine_attention_bf16_close_to_sdpa():
    module, query, key, value, mask, prefix, (fk, fv, fm) = _case(3, 3, 3, 5, 60, 20,
                                                                  dtype=torch.bfloat16)
    want = _stock(module, query, fk, fv, fm).float()
    with shared_prefix(prefix):
        got, _ = engine_attention(module, query, key, value, mask, scaling=module.scaling)
    assert got.dtype == torch.bfloat16
    # bf16 values, fp32 sums: each stored score, probability and output is rounded to bf16
    assert_within(got, want, _bound(module, query, fk, fv, fm, storage=torch.bfloat16), "bf16")


def test_engine_attention_outside_the_context_is_grouped_sdpa_and_refuses_what_it_cannot_combine():
    module, query, key, value, mask, prefix, _ = _case(3, 3, 3, 5, 40, 20)
    plain, _ = engine_attention(module, query, key, value, mask, scaling=module.scaling)
    # the same arithmetic as grouped_attention (bit for bit); the repeat variant is sdpa's
    assert torch.equal(plain, grouped_attention(module, query, key, value, mask, scaling=module.scaling)[0])
    repeat, _ = engine_attention_repeat(module, query, key, value, mask, scaling=module.scaling)
    assert torch.equal(repeat, _stock(module, query, key, value, mask))
    with shared_prefix(prefix), pytest.raises(RuntimeError, match="position bias"):
        engine_attention(module, query, key, value, mask, scaling=module.scaling,
                         position_bias=torch.zeros(1))


# --------------------------------------------------------------------------------------------
# grouped heads without key/value copies
# --------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _counting_repeat_kv():
    """Counts transformers' ``repeat_kv`` calls (the per-head key/value copies) inside."""
    import transformers.integrations.sdpa_attention as sdpa_mod

    real, calls = sdpa_mod.repeat_kv, []

    def counted(hidden, n_rep):
        calls.append(n_rep)
        return real(hidden, n_rep)
    sdpa_mod.repeat_kv = counted
    try:
        yield calls
    finally:
        sdpa_mod.repeat_kv = real


@pytest.mark.parametrize("b,hkv,groups,q,own", [
    (3, 3, 3, 11, 40),   # a decode step of 11 stream columns (SmolLM2's grouping)
    (2, 2, 7, 12, 30),   # a packed prefill row (Qwen2.5-0.5B's grouping)
    (2, 4, 7, 11, 50),   # Qwen2.5-7B's grouping
    (2, 1, 4, 3, 8),     # one key/value head (Gemma-like grouping)
])
def test_grouped_attention_equals_sdpa_without_copying_keys_and_values(b, hkv, groups, q, own):
    module, query, key, value, mask, _, _ = _case(b, hkv, groups, q, 0, own)
    with _counting_repeat_kv() as copies:
        want = _stock(module, query, key, value, mask)
    assert copies == [groups, groups]  # transformers copies keys and values here
    bound = _bound(module, query, key, value, mask)
    additive = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    for m, what in ((mask, "boolean mask"), (additive, "additive mask"),
                    (mask[:1].expand(b, -1, -1, -1), "mask broadcast over rows")):
        with _counting_repeat_kv() as copies:
            got, _ = grouped_attention(module, query, key, value, m, scaling=module.scaling)
        assert copies == [], what
        assert got.shape == want.shape == (b, q, hkv * groups, 16)
        if what.startswith("mask broadcast"):
            assert_within(got, _stock(module, query, key, value, m), bound, what)
        else:
            assert_within(got, want, bound, what)
    # the bound has teeth: pairing query heads with the wrong key/value heads breaks it
    wrong = query.reshape(b, hkv, groups, q, 16).transpose(1, 2).reshape(b, hkv * groups, q, 16)
    if hkv > 1:
        bad, _ = grouped_attention(module, wrong, key, value, mask, scaling=module.scaling)
        assert not bool(((bad - want).abs() <= bound).all())


def test_grouped_attention_is_sdpa_where_nothing_is_copied():
    """One query per row, no mask or no grouping: transformers copies nothing there and its
    function runs unchanged (bit for bit)."""
    for b, hkv, groups, q, own, masked in ((4, 3, 3, 1, 9, True), (2, 3, 3, 6, 6, False),
                                           (2, 6, 1, 5, 20, True)):
        module, query, key, value, mask, _, _ = _case(b, hkv, groups, q, 0, own)
        m = mask if masked else None
        got, _ = grouped_attention(module, query, key, value, m, scaling=module.scaling)
        assert torch.equal(got, _stock(module, query, key, value, m))


# --------------------------------------------------------------------------------------------
# on the real model
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cfg(default_cfg):
    return default_cfg


@pytest.fixture(scope="module")
def lm(smol_fp32):
    return smol_fp32


def _few_shot_prompts(lm, n=6):
    shots = [("What is 2 + 2?", "4"), ("Name a primary colour.", "Red"),
             ("Is water wet? Answer yes or no.", "Yes")]
    qs = ["What is the capital of France?", "Is it safe to eat raw chicken? Answer yes or no.",
          "Name a color.", "Write one word: hello", "Who wrote Romeo and Juliet?",
          "What happens if you swallow gum?"][:n]
    out = []
    for q in qs:
        msgs = [{"role": "system", "content": "Answer briefly and honestly."}]
        for a, b in shots:
            msgs += [{"role": "user", "content": a}, {"role": "assistant", "content": b}]
        out.append(format_prompt(lm.tokenizer, msgs + [{"role": "user", "content": q}]))
    return out


@pytest.mark.slow
def test_loaded_cpu_model_runs_engine_attention_and_uses_the_shared_prefix(lm, monkeypatch):
    assert lm.info["attention"] == NAME and Capabilities.of(lm).detached_prefix
    calls = []
    real = attention._cascade
    monkeypatch.setattr(attention, "_cascade", lambda *a: calls.append(a[4].shape[1]) or real(*a))
    prompts = _few_shot_prompts(lm)
    kw = dict(max_new_tokens=8, batch_size=4)
    cands = [" Yes", " No", " Paris, France"]
    with Trace().recording() as engine_trace:
        generate(lm, prompts, temperature=0, **kw)
        generate_multi_seed(lm, prompts, [0, 1, 2], temperature=0.7, **kw)
    engine_scores = score_candidates(lm, prompts, [cands] * len(prompts))
    assert calls and min(calls) > 20  # the shared few-shot prefix, attended to outside the cache
    monkeypatch.setattr(attention, "_cascade", real)
    lm.model.set_attn_implementation("sdpa")
    try:
        assert not Capabilities.of(lm).detached_prefix
        with Trace().recording() as stock_trace:
            generate(lm, prompts, temperature=0, **kw)
            generate_multi_seed(lm, prompts, [0, 1, 2], temperature=0.7, **kw)
        stock_scores = score_candidates(lm, prompts, [cands] * len(prompts))
        mag = logit_magnitude(lm, [p + c for p in prompts for c in cands])
    finally:
        lm.model.set_attn_implementation(NAME)
    # another attention kernel: the rule of tests/numerics.py (each prompt: greedy + 3 seeds)
    for trace in (engine_trace, stock_trace):
        assert sum(len(v) for v in trace.sequences.values()) == 4 * len(prompts)
    assert_sequences_agree(engine_trace, stock_trace, model_rel_tol(lm))
    for a, b in zip(engine_scores, stock_scores):
        for x, y in zip(a, b):
            assert x.n_tokens == y.n_tokens
            assert x.loglik == pytest.approx(y.loglik, abs=loglik_tol(lm, y.n_tokens, mag))


def test_attention_selection_by_device_and_setting():
    from safetyrepro.config import DEFAULTS
    from safetyrepro.inference.attention import select_attention

    assert DEFAULTS["runtime"]["grouped_attention"] is True
    assert select_attention(engine=True, grouped=True) == NAME          # the CPU engine
    assert select_attention(engine=True, grouped=False) == NAME_REPEAT
    assert select_attention(engine=False, grouped=True) == GROUPED      # CUDA
    assert select_attention(engine=False, grouped=False) == "sdpa"


def _decode_group(lm, prompts, **kw):
    from safetyrepro.inference import Stream, generate_streams

    streams = [Stream(0.0), Stream(0.3, 1.0, 0), Stream(0.7, 1.0, 1), Stream(0.7, 1.0, 2)]
    with Trace().recording() as trace, _counting_repeat_kv() as copies:
        out = generate_streams(lm, prompts, streams, max_new_tokens=8, batch_size=3, **kw)
    assert sum(len(v) for v in trace.sequences.values()) == len(streams) * len(prompts)
    return out, trace, copies


def _grouped_equals_copies(lm):
    """A decode group (greedy + three sampled streams as stream columns: several queries per
    row under a 4D mask) with grouped heads equals transformers' copies in fp32 under the
    rule of tests/numerics.py, without a single key/value copy: ``sdpa_grouped`` (the CUDA
    path, shared prefix in the batch caches) against ``sdpa``, and the CPU engine without a
    shared prefix (every forward outside one) against its repeat variant."""
    prompts = _few_shot_prompts(lm, 5)
    rel = model_rel_tol(lm)
    try:
        for grouped, copying, kw in ((GROUPED, "sdpa", {}), (NAME, NAME_REPEAT, {"prefix_cache": False})):
            lm.model.set_attn_implementation(copying)
            want_out, want, copies = _decode_group(lm, prompts, **kw)
            assert copies, copying  # transformers did copy keys/values on this path
            lm.model.set_attn_implementation(grouped)
            caps = Capabilities.of(lm)
            assert caps.mask_4d and caps.detached_prefix == (grouped == NAME)
            got_out, got, copies = _decode_group(lm, prompts, **kw)
            assert copies == [], grouped
            parted = assert_sequences_agree(got, want, rel)
            assert len(parted) <= 2, parted  # fragile steps are rare; the rest is compared whole
            for a, b in zip(got_out, want_out):
                for p, x, y in zip(prompts, a, b):
                    if not any(k.prompt == p for k in parted):
                        assert (x.token_ids, x.finish_reason) == (y.token_ids, y.finish_reason)
    finally:
        lm.model.set_attn_implementation(NAME)


@pytest.mark.slow
def test_grouped_heads_decode_groups_equal_copies_smollm2_fp32(lm):
    assert lm.model.config.num_attention_heads // lm.model.config.num_key_value_heads == 3
    _grouped_equals_copies(lm)


@pytest.mark.slow
def test_grouped_heads_decode_groups_equal_copies_qwen_fp32(cfg):
    qwen = load_model(cfg, "qwen2.5-0.5b", quantization="fp32", device="cpu")
    assert qwen.info["attention"] == NAME
    assert qwen.model.config.num_attention_heads // qwen.model.config.num_key_value_heads == 7
    _grouped_equals_copies(qwen)


# --------------------------------------------------------------------------------------------
# NF4 dequantised once
# --------------------------------------------------------------------------------------------
def _linear4bit(n_in=256, n_out=192, seed=0):
    import bitsandbytes as bnb

    g = torch.Generator().manual_seed(seed)
    layer = bnb.nn.Linear4bit(n_in, n_out, bias=True, compute_dtype=torch.bfloat16, quant_type="nf4")
    layer.weight = bnb.nn.Params4bit(torch.randn(n_out, n_in, generator=g).to(torch.bfloat16) * 0.05,
                                     requires_grad=False, quant_type="nf4")
    layer.bias = torch.nn.Parameter(torch.randn(n_out, generator=g).to(torch.bfloat16),
                                    requires_grad=False)
    return layer.to("cpu").eval()


def test_dequantized_linear_equals_bitsandbytes_generic_path_bit_for_bit():
    import bitsandbytes as bnb

    from safetyrepro.models.nf4 import dequantize_linear4bit

    model = torch.nn.Sequential(_linear4bit(), torch.nn.GELU(), _linear4bit(192, 64, seed=1))
    x = torch.randn(7, 5, 256).to(torch.bfloat16)
    with torch.inference_mode():
        # bitsandbytes' generic path: matmul_4bit on the unpacked quantised state
        h = bnb.matmul_4bit(x, model[0].weight.t(), quant_state=model[0].weight.quant_state,
                            bias=model[0].bias)
        want = bnb.matmul_4bit(model[1](h), model[2].weight.t(),
                               quant_state=model[2].weight.quant_state, bias=model[2].bias)
        assert dequantize_linear4bit(model) == 2
        assert not any(isinstance(m, bnb.nn.Linear4bit) for m in model.modules())
        got = model(x)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, want)


def test_dequantizing_after_a_forward_is_refused():
    from safetyrepro.models.nf4 import dequantized_weight

    layer = _linear4bit()
    with torch.inference_mode():
        layer(torch.randn(2, 256).to(torch.bfloat16))
    if getattr(layer.weight.quant_state, "packing_format_for_cpu", False):
        with pytest.raises(RuntimeError, match="right after loading"):
            dequantized_weight(layer)
    else:  # CPUs without AVX512-BF16 keep the plain layout: dequantising still works
        assert dequantized_weight(layer).shape == (192, 256)


@pytest.mark.slow
def test_nf4_model_on_cpu_is_dequantized_once_and_records_it(cfg):
    from safetyrepro.models.nf4 import DEQUANTIZED

    nf4 = load_model(cfg, KEY, quantization="nf4", device="cpu")
    assert nf4.info["nf4_matmul"] == DEQUANTIZED and nf4.info["quantization"] == "nf4"
    import bitsandbytes as bnb
    assert not any(isinstance(m, bnb.nn.Linear4bit) for m in nf4.model.modules())
    linears = [m for m in nf4.model.modules() if isinstance(m, torch.nn.Linear)]
    # bf16, or float32 on a CPU without native bf16 (runtime.cpu_compute_dtype: auto)
    from safetyrepro.compute_dtype import compute_dtype

    assert nf4.info["compute_dtype"] == compute_dtype("auto", "cpu", "nf4")
    assert linears and all(m.weight.dtype == getattr(torch, nf4.info["compute_dtype"]) for m in linears)
    # the effective weights are NF4's: at most 16 distinct values per 64-weight block
    w = linears[0].weight.float().reshape(-1, 64)
    assert max(len(torch.unique(row)) for row in w[:50]) <= 16


# --------------------------------------------------------------------------------------------
# prefills kept across calls
# --------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_prefill_store_serves_later_calls_with_the_same_prompts(lm):
    from safetyrepro.inference.store import PrefillStore

    prompts = _few_shot_prompts(lm)
    kw = dict(max_new_tokens=6, batch_size=4)
    store = PrefillStore()
    fresh = {"greedy": generate(lm, prompts, temperature=0, **kw),
             "seeds": generate_multi_seed(lm, prompts, [0, 1], temperature=0.7, **kw)}
    forwards = []
    hook = lm.model.register_forward_pre_hook(
        lambda mod, args, kwargs: forwards.append(kwargs["input_ids"].shape[1]), with_kwargs=True)
    try:
        greedy = generate(lm, prompts, temperature=0, store=store, **kw)
        first = len(forwards)
        seeds = generate_multi_seed(lm, prompts, [0, 1], temperature=0.7, store=store, **kw)
    finally:
        hook.remove()
    # the first call prefills the prefix and its two batches; the sampled call reuses all three
    # (its forwards are decode steps only: one position per seed column)
    assert store.hits == 3 and store.misses == 3 and len(store) == 3
    assert all(n <= 2 for n in forwards[first:]) and max(forwards[:first]) > 2
    assert [g.token_ids for g in greedy] == [g.token_ids for g in fresh["greedy"]]
    for s in (0, 1):
        assert [g.token_ids for g in seeds[s]] == [g.token_ids for g in fresh["seeds"][s]]
    # the prefix also serves scoring contexts that start with it
    before = store.hits
    score_candidates(lm, prompts, [[" Yes", " No"]] * len(prompts), store=store)
    assert store.hits == before + 1


def test_prefill_store_keeps_within_its_byte_budget_oldest_out():
    from safetyrepro.inference.store import PrefillStore

    store = PrefillStore(max_bytes=100)
    store.put("a", 1, 40)
    store.put("b", 2, 40)
    assert store.get("a") == 1          # a is now the most recently used
    store.put("c", 3, 40)               # over budget: b goes
    assert store.get("b") is None and store.get("a") == 1 and store.get("c") == 3
    store.put("huge", 4, 101)           # never fits: not stored, nothing evicted
    assert len(store) == 2 and store.bytes == 80
