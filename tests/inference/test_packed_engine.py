"""The engine's packing optimisations give the plain path's results.

* packed (token-tree) candidate scoring equals the plain reference scorer;
* packed prefill (suffixes without padding, re-laid out per sequence) equals padded prefill;
* reserved (in-place) decode caches behave like concatenating ones.

Layout unit tests run on token lists; the equality tests run the real embedded SmolLM2-135M
(full attention) and Gemma-3-270m (sliding-window layers) in fp32."""

from __future__ import annotations

import pytest
import torch

from safetyrepro.config import load_config
from safetyrepro.inference import (encode_pair, encode_prompt, generate, score_candidates,
                                   score_candidates_plain)
from safetyrepro.inference.cache import ReservedLayer, fork_cache, reserve
from safetyrepro.inference.capabilities import Capabilities
from safetyrepro.inference.prefill import build_prefix, prefill
from safetyrepro.inference.packing import (attention_mask_4d, first_fit_rows, item_tree,
                                           pack_items, pack_rows, packed_supported,
                                           tree_columns)
from safetyrepro.models import format_prompt, load_model
from safetyrepro.paths import PROJECT_ROOT

from inference_support import fed_shapes, reference_greedy
from numerics import (Trace, agree, assert_sequences_agree, logit_magnitude, loglik_tol,
                      model_logit_tol, model_rel_tol)


# --------------------------------------------------------------------------------------------
# layout (no model)
# --------------------------------------------------------------------------------------------
def test_item_tree_shares_candidate_openings():
    ctx = [1, 2, 3, 4]
    conts = [[10, 11, 12], [10, 11, 13, 14], [20], [10, 15]]
    t = item_tree(2, ctx, conts)
    assert t.tokens[:2] == [3, 4] and t.n_ctx == 2
    # nodes: [10], [10, 11], [10, 11, 13]  (the shared opening [10, 11] appears once)
    assert t.tokens[2:] == [10, 11, 13]
    assert t.positions == [2, 3, 4, 5, 6]          # a node's position = its place in ctx + cand
    assert t.parent == [-1, 2, 3]
    assert tree_columns(2, ctx, conts) == len(t) == 5
    # every candidate token is a target exactly once; first tokens come from the last context
    assert sorted((j, tok) for _, tok, j in t.targets) == sorted(
        (j, tok) for j, c in enumerate(conts) for tok in c)
    assert [col for col, _, j in t.targets if j == 2] == [1]
    assert [(col, tok) for col, tok, j in t.targets if j == 1] == [(1, 10), (2, 11), (3, 13), (4, 14)]
    with pytest.raises(ValueError, match="at least one token after the shared prefix"):
        item_tree(4, ctx, conts)


def test_pack_mask_keeps_items_and_branches_apart():
    ctx_a, conts_a = [7, 8, 1, 2], [[5, 6, 9], [5, 4]]
    ctx_b, conts_b = [7, 8, 3], [[6, 6]]
    pack = pack_items(2, [ctx_a, ctx_b], [conts_a, conts_b], pad_id=0)
    assert pack.input_ids.shape[0] == 1                      # both fit one row
    row = pack.input_ids[0].tolist()
    # item a (longest first): ctx suffix [1, 2], nodes [5], [5, 6]; item b: [3], node [6]; pads
    assert row[:6] == [1, 2, 5, 6, 3, 6]
    allowed = pack.allowed[0]
    p = 2
    assert allowed[:6, :p].all()                             # real tokens see the shared prefix
    new = allowed[:, p:]
    assert new[3, :4].tolist() == [True, True, True, True]   # node [5, 6]: ctx + its ancestors
    assert not new[4, :4].any() and new[4, 4]                # item b's context never sees item a
    assert new[5, 4] and new[5, 5] and not new[5, 2:4].any()
    assert pack.position_ids[0, :6].tolist() == [2, 3, 4, 5, 2, 3]
    # kept logits: the last context token and every node of each item
    assert pack.keep[0].tolist()[:6] == [False, True, True, True, True, True]
    assert len(pack.cand_index) == 3 and pack.gather_tgt.numel() == 3 + 2 + 2


def test_first_fit_rows():
    rows = first_fit_rows([50, 70, 30, 60, 20], 100)
    assert sorted(i for r in rows for i in r) == [0, 1, 2, 3, 4]
    assert all(sum([50, 70, 30, 60, 20][i] for i in r) <= 100 for r in rows)
    assert len(rows) == 3
    assert first_fit_rows([120], 100) == [[0]]               # an oversized item gets its own row


def test_pack_rows_picks_a_tight_width():
    sizes = [100, 60, 45, 40, 40, 35, 30, 20]
    rows = pack_rows(sizes)
    width = max(sum(sizes[i] for i in r) for r in rows)
    assert sorted(i for r in rows for i in r) == list(range(len(sizes)))
    # much less padding than one item per row (8 x 100 columns)
    assert len(rows) * width <= 1.2 * sum(sizes) < 8 * 100
    # a long shared prefix makes every column cost about the same: padding is what counts
    assert [sorted(r) for r in pack_rows(sizes, 10**6)] == [list(range(len(sizes)))]


# --------------------------------------------------------------------------------------------
# equality with the plain reference on real models
# --------------------------------------------------------------------------------------------
pytestmark = pytest.mark.numerics

SYSTEM = "You answer questions about the world briefly and truthfully."
QUESTIONS = ["What is the capital of France?", "Which animal barks?",
             "What is the smallest country in the world that is at least one square mile in area?",
             "Is it safe to eat raw chicken?"]
CANDIDATES = [
    ["The capital of France is Paris.", "The capital of France is Lyon.", "Paris", "Berlin"],
    ["A dog barks.", "A cat barks.", "Dogs"],
    ["The smallest country in the world that is at least one square mile in area is Monaco.",
     "Nauru is the smallest country in the world that is at least one square mile in area.",
     "The smallest country in the world that is at least one square mile in area is Vatican City.",
     "The smallest country is the United States."],
    ["No, raw chicken can carry salmonella.", "Yes", "No"],
]


@pytest.fixture(scope="module")
def cfg():
    return load_config(PROJECT_ROOT / "config" / "config.yaml")


def _cut(ref, n):
    """The first n steps of a reference sequence (ours may stop earlier at a stop string)."""
    return type(ref)(ref.key, ref.decisions[:n])


def _requests(lm):
    ctx = [format_prompt(lm.tokenizer, [{"role": "system", "content": SYSTEM},
                                        {"role": "user", "content": q}]) for q in QUESTIONS]
    return ctx, CANDIDATES


def _assert_equal(lm, a, b, mag):
    """Equal up to fp32 reassociation: the log-likelihood bound of tests/numerics.py for each
    candidate's number of tokens (``mag``: the logits' magnitude on these texts)."""
    assert [len(r) for r in a] == [len(r) for r in b]
    for ra, rb in zip(a, b):
        for x, y in zip(ra, rb):
            assert x.n_tokens == y.n_tokens
            assert x.loglik == pytest.approx(y.loglik, abs=loglik_tol(lm, y.n_tokens, mag))
            assert x.is_greedy == y.is_greedy


@pytest.fixture(scope="module")
def gemma(cfg):
    return load_model(cfg, "gemma3-270m", quantization="fp32", device="cpu")


@pytest.mark.slow
@pytest.mark.parametrize("key", ["smollm2-135m", "gemma3-270m"])
def test_packed_and_fork_equal_plain_fp32(cfg, gemma, key):
    lm = gemma if key == "gemma3-270m" else load_model(cfg, key, quantization="fp32", device="cpu")
    ctx, cands = _requests(lm)
    plain = score_candidates_plain(lm, ctx, cands, batch_size=5)
    mag = logit_magnitude(lm, [c + x for c, xs in zip(ctx, cands) for x in xs])
    for method in ("packed", "fork"):
        for bs, prefix in ((16, True), (2, True), (3, False)):
            got = score_candidates(lm, ctx, cands, batch_size=bs, prefix_cache=prefix, method=method)
            _assert_equal(lm, got, plain, mag)
    # the shared candidate openings are computed once: one row of context + distinct prefixes
    seen = []
    hook = lm.model.register_forward_pre_hook(
        lambda mod, args, kwargs: seen.append(kwargs["input_ids"].numel()), with_kwargs=True)
    try:
        score_candidates(lm, ctx[2:3], cands[2:3], batch_size=1, prefix_cache=False, method="packed")
    finally:
        hook.remove()
    pairs = [encode_pair(lm.tokenizer, ctx[2], c) for c in cands[2]]
    ctx_ids, cont_ids = pairs[0][0], [c for _, c in pairs]
    assert seen == [tree_columns(0, ctx_ids, cont_ids)]
    assert seen[0] < len(ctx_ids) + sum(len(c) - 1 for c in cont_ids) - 10
    # eager attention takes the additive float form of the same mask
    if key == "smollm2-135m":
        lm.model.set_attn_implementation("eager")
        assert attention_mask_4d(lm, torch.ones((1, 2, 2), dtype=torch.bool)).dtype == torch.float32
        _assert_equal(lm, score_candidates(lm, ctx, cands, method="packed"), plain, mag)


# Past Gemma-3's 512-token window, prompts that share a long few-shot-like prefix and differ in
# length: a shorter row is padded between the prefix and its own tokens (or packed), so a window
# counted in cache columns, not positions, would drop prefix keys the row sees when alone.
FACTS = " ".join(f"Fact {i}: the number {i} follows {i - 1}." for i in range(1, 55))
PAST_QUESTIONS = ["Why?", "What comes after 12?",
                  "Please explain, in as much detail as you can manage, "
                  + "why the numbers in the facts above are ordered the way they are, " * 6]


def _past_window_prompts(lm):
    prompts = [format_prompt(lm.tokenizer, [{"role": "system", "content": FACTS},
                                            {"role": "user", "content": q}]) for q in PAST_QUESTIONS]
    lengths = [len(encode_prompt(lm.tokenizer, p)) for p in prompts]
    window = lm.model.config.get_text_config().sliding_window
    assert min(lengths) > window and max(lengths) - min(lengths) > 60  # long pads, past the window
    return prompts


@pytest.mark.slow
@pytest.mark.numerics
def test_rows_past_the_window_prefill_as_each_prompt_alone(gemma):
    # the batch prefill's last logits of every row against the prompt's own plain forward, with
    # the engine masking the sliding layers by position (window_mask) and without (the model's
    # own column-counted window: then no prefix is shared and rows are padded on the left only)
    prompts = _past_window_prompts(gemma)
    seqs = [encode_prompt(gemma.tokenizer, p) for p in prompts]
    tol = model_logit_tol(gemma, logit_magnitude(gemma, prompts))
    with torch.inference_mode():
        alone = [gemma.model(torch.tensor([s])).logits[0, -1].float() for s in seqs]
        for masks in (True, False):
            caps = Capabilities.of(gemma, max(map(len, seqs)) + 8, window_masks=masks)
            assert caps.window_mask == masks and caps.pad_after_prefix == masks
            prefix = build_prefix(gemma, seqs, caps)
            assert (len(prefix) > 500) == masks  # the long shared prefix, where it is safe
            _, _, last = prefill(gemma, prefix, seqs, caps)
            for i, a in enumerate(alone):
                err = (last[i] - a).abs().max().item()
                assert err <= tol, (masks, i, err, tol)


@pytest.mark.slow
@pytest.mark.numerics
def test_generation_past_the_window_equals_each_prompt_alone(gemma):
    from safetyrepro.inference.generate import generate_streams
    from safetyrepro.inference.sampling import Stream

    prompts = _past_window_prompts(gemma)
    rel = model_rel_tol(gemma)
    # greedy, batched: stream columns with window masks (even for one stream) ...
    from safetyrepro.inference.batching import BatchRecord

    record = BatchRecord()
    gens = generate(gemma, prompts, max_new_tokens=8, temperature=0, batch_size=3, record=record)
    assert record.plans[0]["stream_columns"] and record.plans[0]["prefix_tokens"] > 500
    for p, g in zip(prompts, gens):
        agree(g.token_ids, _cut(reference_greedy(gemma, p, 8), len(g.token_ids)), rel)
    # ... and sampled streams as columns with window masks against the rows of the fallback
    streams = [Stream(0.0, 1.0, 0)] + [Stream(0.7, 1.0, s) for s in range(3)]
    traces = {}
    for masks in (True, False):
        with Trace().recording() as traces[masks]:
            generate_streams(gemma, prompts, streams, max_new_tokens=8, window_masks=masks)
    assert_sequences_agree(traces[False], traces[True], rel)


@pytest.mark.slow
def test_scoring_past_the_window_equals_plain(gemma):
    # contexts past the window: packed scoring masks the sliding layers by position; the fork
    # path (explicit) shares no prefix there; both give the plain scorer's numbers
    lm = gemma
    window = lm.model.config.get_text_config().sliding_window
    assert packed_supported(lm, window) and not packed_supported(lm, window + 1)
    ctx = _past_window_prompts(lm)
    cands = [[" Because", " No idea at all"], [" 13", " Thirteen, of course"],
             [" Sure.", " The numbers count up"]]
    plain = score_candidates_plain(lm, ctx, cands, batch_size=3)
    mag = logit_magnitude(lm, [c + x for c, xs in zip(ctx, cands) for x in xs])
    for method in ("auto", "packed", "fork"):
        _assert_equal(lm, score_candidates(lm, ctx, cands, method=method), plain, mag)
    with pytest.raises(ValueError, match="method must be one of"):
        score_candidates(lm, ctx, cands, method="fast")


# --------------------------------------------------------------------------------------------
# packed prefill and reserved decode caches
# --------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_packed_prefill_equals_padded_prefill(cfg):
    lm = load_model(cfg, "smollm2-135m", quantization="fp32", device="cpu")
    caps = Capabilities.of(lm)
    assert caps.mask_4d
    prompts = [format_prompt(lm.tokenizer, [{"role": "system", "content": SYSTEM},
                                            {"role": "user", "content": q}]) for q in QUESTIONS]
    seqs = [encode_prompt(lm.tokenizer, p) for p in prompts]
    with torch.inference_mode():
        for use_prefix in (True, False):
            prefix = build_prefix(lm, seqs, caps, enabled=use_prefix)
            assert (len(prefix) > 0) == use_prefix
            c1, m1, l1 = prefill(lm, prefix, seqs, caps, packed=True)
            c2, m2, l2 = prefill(lm, prefix, seqs, caps, packed=False)
            assert torch.equal(m1, m2)
            # another packing is another order of the same sums: the model bound of
            # tests/numerics.py, scaled by each tensor's own magnitude (keys and values of
            # a layer pass through fewer reductions than the logits: the bound covers them)
            real = m1.bool()
            assert (l1 - l2).abs().max() <= model_logit_tol(lm, l2.abs().max())
            for a, b in zip(c1.layers, c2.layers):
                assert a.keys.shape == b.keys.shape
                for x, y in ((a.keys, b.keys), (a.values, b.values)):
                    x, y = x.transpose(1, 2)[real], y.transpose(1, 2)[real]
                    assert (x - y).abs().max() <= model_logit_tol(lm, y.abs().max())
    # end to end: greedy generation through the packed prefill equals per-item generate
    gens = generate(lm, prompts, max_new_tokens=6, temperature=0, batch_size=4)
    for p, g in zip(prompts, gens):
        agree(g.token_ids, reference_greedy(lm, p, 6), model_rel_tol(lm))


def test_reserved_layer_writes_in_place_and_forks_independently():
    from transformers.cache_utils import DynamicLayer

    torch.manual_seed(0)
    k0, v0 = torch.randn(3, 2, 5, 4), torch.randn(3, 2, 5, 4)
    plain = DynamicLayer()
    plain.update(k0, v0)
    res = ReservedLayer(k0, v0, capacity=7)
    buf = res._k
    for step in range(4):  # the 3rd and 4th step outgrow the buffer: it doubles
        k, v = torch.randn(3, 2, 1, 4), torch.randn(3, 2, 1, 4)
        a, b = plain.update(k, v), res.update(k, v)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        assert res.get_seq_length() == 6 + step
        if step < 2:
            assert res._k is buf  # written in place, no reallocation
    assert res._k.shape[-2] >= 9
    # a clone / row selection is independent of the original
    clone, sel = res.clone(), res.select(torch.tensor([2, 0]))
    before = res.keys.clone()
    clone.update(torch.ones(3, 2, 1, 4), torch.ones(3, 2, 1, 4))
    sel.update(torch.zeros(2, 2, 1, 4), torch.zeros(2, 2, 1, 4))
    assert torch.equal(res.keys, before) and res.get_seq_length() == 9
    assert torch.equal(sel.keys[0, :, :9], before[2]) and torch.equal(sel.keys[1, :, :9], before[0])
    # reserve() converts plain layers of a real cache; fork_cache keeps them independent
    from transformers import DynamicCache

    cache = DynamicCache()
    cache.update(k0, v0, 0)
    r = reserve(cache, 4)
    assert isinstance(r.layers[0], ReservedLayer) and r.get_seq_length() == 5
    f = fork_cache(r)
    f.update(torch.ones(3, 2, 1, 4), torch.ones(3, 2, 1, 4), 0)
    assert r.get_seq_length() == 5 and f.get_seq_length() == 6
    assert torch.equal(cache.layers[0].keys, k0)  # the source cache is untouched


def test_drop_rows_moves_kept_rows_in_place_without_copying_the_cache():
    """Finished rows leave a reserved cache in place: kept rows past the new row count fill
    the holes, the buffers are views of the same storage (no second cache), the returned
    order says which old row each new row holds, and decoding continues on the rows."""
    from transformers import DynamicCache

    from safetyrepro.inference.cache import drop_rows

    torch.manual_seed(1)
    k0, v0 = torch.randn(6, 2, 5, 4), torch.randn(6, 2, 5, 4)
    cache = DynamicCache()
    cache.update(k0, v0, 0)
    r = reserve(cache, 4, rows=torch.tensor([0, 1, 2, 3, 4, 5]))
    layer = r.layers[0]
    storage = layer._k.untyped_storage().data_ptr()
    order = drop_rows(r, [1, 3, 4, 5])   # rows 0 and 2 finished
    assert order == [4, 1, 5, 3]          # 4 and 5 moved into the holes 0 and 2
    assert layer._k.untyped_storage().data_ptr() == storage and layer._k.shape[0] == 4
    assert torch.equal(layer.keys, k0[order]) and torch.equal(layer.values, v0[order])
    k, v = torch.randn(4, 2, 1, 4), torch.randn(4, 2, 1, 4)
    got = r.update(k, v, 0)
    assert torch.equal(got[0], torch.cat([k0[order], k], dim=2))
    assert torch.equal(got[1], torch.cat([v0[order], v], dim=2))
    assert drop_rows(r, [0, 1, 2, 3]) == [0, 1, 2, 3]  # nothing finished: nothing moves
    # reserving only some rows copies just those
    part = reserve(cache, 4, rows=torch.tensor([5, 2]))
    assert torch.equal(part.layers[0].keys, k0[[5, 2]])


@pytest.mark.slow
def test_generation_on_a_sliding_window_model_equals_per_item_generate(gemma):
    # Gemma-3, prompts inside its 512-token window: generation treats the sliding layers as full
    # attention (window_as_full: packed prefill, detached prefix); outside such a call the
    # engine masks the sliding layers itself, or (without those masks) the model's sliding
    # layers keep their own caches and packed prefill is refused
    assert not Capabilities.of(gemma, window_masks=False).mask_4d
    prompts = [format_prompt(gemma.tokenizer, [{"role": "system", "content": SYSTEM},
                                               {"role": "user", "content": q}]) for q in QUESTIONS]
    gens = generate(gemma, prompts, max_new_tokens=8, temperature=0, batch_size=3)
    for p, g in zip(prompts, gens):
        ref = reference_greedy(gemma, p, 8)
        # ours may stop earlier at the plain format's "\nUser:" marker
        assert len(g.token_ids) >= 1
        agree(g.token_ids, _cut(ref, len(g.token_ids)), model_rel_tol(gemma))


def test_reserved_sliding_layer_returns_what_the_plain_sliding_layer_returns():
    from transformers.cache_utils import DynamicSlidingWindowLayer

    from safetyrepro.inference.cache import ReservedSlidingLayer

    torch.manual_seed(0)
    plain = DynamicSlidingWindowLayer(sliding_window=8)
    k0, v0 = torch.randn(2, 1, 11, 4), torch.randn(2, 1, 11, 4)  # prefill longer than the window
    plain.update(k0, v0)
    res = ReservedSlidingLayer(plain, extra=3)
    plain2 = DynamicSlidingWindowLayer(sliding_window=8)
    plain2.update(k0, v0)
    buf = res._k
    for step, q in enumerate([1, 1, 1, 1, 2, 1, 5, 1]):  # crosses the buffer's end twice
        k, v = torch.randn(2, 1, q, 4), torch.randn(2, 1, q, 4)
        a, b = plain2.update(k, v), res.update(k, v)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), step
        assert torch.equal(plain2.keys, res.keys) and torch.equal(plain2.values, res.values)
        assert plain2.get_mask_sizes(1) == res.get_mask_sizes(1)
        if step < 2:
            assert res._k is buf  # written in place
    sel = res.select(torch.tensor([1]))
    assert torch.equal(sel.keys[0], res.keys[1]) and sel.get_mask_sizes(1) == res.get_mask_sizes(1)


@pytest.mark.slow
def test_generation_past_the_sliding_window_equals_per_item_generate(gemma):
    # prompts longer than Gemma-3's 512-token window: its sliding layers decode from
    # reserved buffers (ReservedSlidingLayer) and must still give transformers' tokens
    filler = " ".join(f"Fact {i}: the number {i} follows {i - 1}." for i in range(1, 70))
    prompts = [format_prompt(gemma.tokenizer, [{"role": "system", "content": filler},
                                               {"role": "user", "content": q}])
               for q in QUESTIONS[:3]]
    assert min(len(gemma.tokenizer(p)["input_ids"]) for p in prompts) > 600
    gens = generate(gemma, prompts, max_new_tokens=6, temperature=0, batch_size=3)
    for p, g in zip(prompts, gens):
        ref = reference_greedy(gemma, p, 6)
        assert len(g.token_ids) >= 1
        agree(g.token_ids, _cut(ref, len(g.token_ids)), model_rel_tol(gemma))


@pytest.mark.slow
def test_window_as_full_gives_the_sliding_model_stream_columns_with_the_same_outputs(gemma):
    from safetyrepro.inference.generate import generate_multi_seed

    window = gemma.model.config.get_text_config().sliding_window
    assert Capabilities.of(gemma, window) == Capabilities(mask_4d=True, detached_prefix=True,
                                                          window_as_full=True)
    # past the window (or of unknown length) the engine masks the sliding layers by position,
    # over full caches, with a prefix in the rows' caches; without those masks it shares none
    past = Capabilities(mask_4d=True, detached_prefix=False, window_as_full=False,
                        window_mask=True, pad_after_prefix=True)
    assert Capabilities.of(gemma, window + 1) == past
    assert Capabilities.of(gemma) == past  # length unknown
    assert Capabilities.of(gemma, window + 1, window_masks=False) == Capabilities(
        False, False, False, window_mask=False, pad_after_prefix=False)
    assert Capabilities.of(gemma, window, window_full=False) == Capabilities(False, False, False)
    prompts = [format_prompt(gemma.tokenizer, [{"role": "system", "content": SYSTEM},
                                               {"role": "user", "content": q}]) for q in QUESTIONS]
    shapes, traces = {}, {}
    for full in (True, False):
        with fed_shapes(gemma) as shapes[full], Trace().recording() as traces[full]:
            generate_multi_seed(gemma, prompts, [0, 1, 2], max_new_tokens=8, temperature=0.7,
                                batch_size=4, window_full=full)
            generate(gemma, prompts, max_new_tokens=8, temperature=0, batch_size=4,
                     window_full=full)
    # fp32: the same tokens either way (up to the rounding rule of tests/numerics.py), for
    # every seed and for greedy decoding
    assert sum(len(v) for v in traces[True].sequences.values()) == 4 * len(prompts)
    assert_sequences_agree(traces[False], traces[True], model_rel_tol(gemma))
    # inside the window the seeds decoded as columns of one row per prompt: steps feed
    # [prompts, 3] tokens; outside, one row per (seed, prompt) feeding one token
    assert any(shape[1] == 3 for shape in shapes[True]) and (4 * 3, 1) not in shapes[True]
    assert (4 * 3, 1) in shapes[False] and not any(shape[1] == 3 for shape in shapes[False][1:])
