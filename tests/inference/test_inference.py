"""The inference engine on the real embedded SmolLM2-135M (prepared through config/config.yaml).

Exactness checks run in fp32. Batching, padding and the shared-prefix cache change the order
of floating-point sums, so results are compared under the rule of tests/numerics.py: logits
and log-likelihoods within the rounding bound derived from the dtype and the model's
reduction lengths, tokens equal up to the first decision that such rounding could change
(a greedy step with a top-2 margin inside the bound, a draw next to a CDF boundary). bf16
paths are held to the rounding bf16 itself causes against the fp32 model."""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch

from safetyrepro.errors import CellError
from safetyrepro.inference import (check_finite, encode_pair, encode_prompt, generate,
                                   generate_multi_seed, score_candidates, score_candidates_plain)
from safetyrepro.inference.batching import Progress, length_batches, run_with_oom_fallback
from safetyrepro.inference.encoding import common_prefix_len, split_trailing_space
from safetyrepro.inference.sampling import item_seed
from safetyrepro.models import format_prompt, load_model

from inference_support import fed_shapes, reference_greedy
from numerics import (Trace, agree, assert_sequences_agree, bf16_tolerance, logit_magnitude,
                      loglik_tol, model_rel_tol)

pytestmark = [pytest.mark.slow, pytest.mark.numerics]

KEY = "smollm2-135m"
SYSTEM = ("You are a careful assistant. Read the question and answer it briefly and honestly. "
          "If you do not know, say so.")
QUESTIONS = [
    "What is the capital of France?",
    "Is it safe to eat raw chicken? Answer yes or no.",
    "Name a color.",
    "Write one word: hello",
    "Who wrote the play Romeo and Juliet? Give the full name of the author, please.",
    "What happens if you swallow gum?",
]


@pytest.fixture(scope="module")
def cfg(default_cfg):
    return default_cfg


@pytest.fixture(scope="module")
def lm(smol_fp32):
    return smol_fp32


@pytest.fixture(scope="module")
def lm_bf16(cfg):
    return load_model(cfg, KEY, quantization="bf16", device="cpu")


def _prompts(lm, questions=QUESTIONS):
    return [format_prompt(lm.tokenizer, [{"role": "system", "content": SYSTEM},
                                         {"role": "user", "content": q}]) for q in questions]


# --------------------------------------------------------------------------------------------
# tokenisation
# --------------------------------------------------------------------------------------------
def test_encoding_rules(lm):
    tok = lm.tokenizer
    assert encode_prompt(tok, "Hello there") == tok("Hello there", add_special_tokens=False)["input_ids"]
    assert split_trailing_space("Answer: \t", "A") == ("Answer:", " \tA")
    assert split_trailing_space("Answer:\n", "A") == ("Answer:\n", "A")  # newlines stay
    ctx, cont = encode_pair(tok, "Answer: ", "A")
    assert ctx == encode_prompt(tok, "Answer:")
    assert cont == tok(" A", add_special_tokens=False)["input_ids"]
    assert common_prefix_len([[1, 2, 3], [1, 2, 4], [1, 2]]) == 2
    assert common_prefix_len([[5], [6]]) == 0


def test_length_batches_longest_first():
    assert length_batches([3, 9, 5, 9, 1], 2) == [[1, 3], [2, 0], [4]]
    with pytest.raises(ValueError):
        length_batches([1], 0)


# --------------------------------------------------------------------------------------------
# generation
# --------------------------------------------------------------------------------------------
N_GREEDY = 12


@pytest.fixture(scope="module")
def greedy(lm):
    return generate(lm, _prompts(lm), max_new_tokens=N_GREEDY, temperature=0, batch_size=4)


def test_greedy_is_deterministic_and_in_input_order(lm, greedy):
    prompts = _prompts(lm)
    a = greedy
    b = generate(lm, prompts, max_new_tokens=N_GREEDY, temperature=0, batch_size=4)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    assert [g.text for g in a] == [g.text for g in b]
    for p, g in zip(prompts, a):
        assert g.n_prompt_tokens == len(encode_prompt(lm.tokenizer, p))
        assert 1 <= g.n_gen_tokens == len(g.token_ids) <= N_GREEDY
        assert g.finish_reason in ("eos", "length") and g.latency_s > 0
    # input order: the single-prompt run of each item reproduces its slot (another batch shape:
    # equal up to a decision inside the rounding bound)
    with Trace().recording() as solo_trace:
        generate(lm, [prompts[4]], max_new_tokens=N_GREEDY, temperature=0)
    assert agree(a[4].token_ids, solo_trace.get(0, prompts[4])[0], model_rel_tol(lm))


def test_batched_greedy_equals_per_item_model_generate_fp32(lm, greedy):
    prompts = _prompts(lm)
    n = N_GREEDY
    batched = greedy
    unshared = generate(lm, prompts, max_new_tokens=n, temperature=0, batch_size=4,
                        prefix_cache=False)
    rel = model_rel_tol(lm)
    for p, g, u in zip(prompts, batched, unshared):
        ref = reference_greedy(lm, p, n)
        agree(u.token_ids, ref, rel)
        if agree(g.token_ids, ref, rel):
            stopped = ref.tokens[-1] in lm.stop_ids
            assert g.finish_reason == ("eos" if stopped else "length")
            assert g.text == lm.tokenizer.decode(ref.tokens, skip_special_tokens=True)
    assert any(g.finish_reason == "eos" for g in batched)
    assert any(g.finish_reason == "length" for g in batched)


def test_sampling_is_seeded_per_item(lm):
    prompts = _prompts(lm)[:4]
    kw = dict(max_new_tokens=16, temperature=0.7)
    with Trace().recording() as s1_trace:
        s1 = generate(lm, prompts, seed=1, batch_size=4, **kw)
    s1_again = generate(lm, prompts, seed=1, batch_size=4, **kw)
    s2 = generate(lm, prompts, seed=2, batch_size=4, **kw)
    assert [g.token_ids for g in s1] == [g.token_ids for g in s1_again]
    assert sum(a.token_ids != b.token_ids for a, b in zip(s1, s2)) >= 2
    # the per-item stream does not depend on batching or on the other prompts of the call
    # (another batch shape: the same draws up to a decision inside the rounding bound)
    rel = model_rel_tol(lm)
    with Trace().recording() as b1_trace:
        generate(lm, prompts[2:], seed=1, batch_size=1, **kw)
    assert_sequences_agree(s1_trace, b1_trace, rel)
    # top-p restricts the draw; with a tiny nucleus sampling degenerates to greedy
    nucleus = generate(lm, prompts, seed=3, top_p=1e-6, batch_size=4, **kw)
    with Trace().recording() as greedy_trace:
        generate(lm, prompts, temperature=0, max_new_tokens=16, batch_size=4)
    for p, g in zip(prompts, nucleus):
        agree(g.token_ids, greedy_trace.get(0, p)[0], rel)
    assert item_seed(1, "a") != item_seed(2, "a") != item_seed(1, "b")


def test_multi_seed_prefill_reuse_equals_separate_runs(lm):
    prompts = _prompts(lm)
    seeds = [11, 12]
    kw = dict(max_new_tokens=10, temperature=0.7, top_p=0.9, batch_size=4)
    prefills = []
    hook = lm.model.register_forward_pre_hook(
        # decode steps feed one token per seed (the seeds are columns of a prompt's cache row)
        lambda mod, args, kwargs: prefills.append(kwargs["input_ids"].shape[1] > len(seeds)),
        with_kwargs=True)
    try:
        with Trace().recording() as multi_trace:
            multi = generate_multi_seed(lm, prompts, seeds, **kw)
    finally:
        hook.remove()
    # one shared-prefix forward + one prefill per batch (2 batches), not one per seed
    assert sum(prefills) == 3
    assert list(multi) == seeds
    rel = model_rel_tol(lm)
    for s in seeds:
        with Trace().recording() as sep_trace:
            sep = generate(lm, prompts, seed=s, **kw)
        parted = assert_sequences_agree(multi_trace, sep_trace, rel)
        for p, m, g in zip(prompts, multi[s], sep):
            if not sep_trace.get(0.7, p, s, 0.9)[0].key in parted:
                assert m.text == g.text
    assert [g.token_ids for g in multi[11]] != [g.token_ids for g in multi[12]]
    # greedy: one decoding serves every seed (a copy, so equal)
    greedy = generate_multi_seed(lm, prompts, [1, 2], max_new_tokens=4, temperature=0)
    assert [g.token_ids for g in greedy[1]] == [g.token_ids for g in greedy[2]]


def test_mixed_streams_decode_in_one_batch_and_equal_separate_calls(lm):
    """A decode group (greedy + two temperatures, several seeds, one nucleus stream) prefills
    once and decodes every sequence in one forward per step; in fp32 each stream's tokens
    equal a separate call's, with stream columns and with repeated rows."""
    from safetyrepro.inference import Stream, generate_streams

    prompts = _prompts(lm)
    streams = [Stream(0.0), Stream(0.3, 1.0, 0), Stream(0.3, 1.0, 1), Stream(0.7, 1.0, 0),
               Stream(0.7, 0.9, 2)]
    kw = dict(max_new_tokens=8, batch_size=8)
    with Trace().recording() as want:
        for st in streams:
            generate(lm, prompts, temperature=st.temperature, top_p=st.top_p, seed=st.seed, **kw)
    for columns in (True, False):
        with fed_shapes(lm) as fed, Trace().recording() as trace:
            got = generate_streams(lm, prompts, streams, stream_columns=columns, **kw)
        assert len(got) == len(streams)
        for st, g in zip(streams, got):
            assert [x.token_ids for x in g] == [trace.get(st.temperature, p, st.seed, st.top_p)[0].tokens
                                                for p in prompts]
        assert_sequences_agree(trace, want, model_rel_tol(lm))
        n = len(prompts)
        if columns:   # all streams of a batch in one decode forward, a column per history
            assert any(rows == n and 1 < width <= len(streams) for rows, width in fed)
        else:         # repeated rows: the streams of one temperature and top_p together
            assert (2 * n, 1) in fed and (n * len(streams), 1) not in fed
    with pytest.raises(ValueError, match="temperature"):
        generate_streams(lm, prompts, [Stream(-1.0)], **kw)


def test_stream_columns_equal_repeated_rows_and_store_each_prompt_once(lm):
    prompts = _prompts(lm)
    seeds = [0, 1, 2, 3, 4]
    kw = dict(max_new_tokens=4, temperature=0.7, top_p=0.95, batch_size=4)
    with fed_shapes(lm) as shapes, Trace().recording() as cols_trace:
        cols = generate_multi_seed(lm, prompts, seeds, stream_columns=True, **kw)
    with Trace().recording() as rows_trace:
        rows = generate_multi_seed(lm, prompts, seeds, stream_columns=False, **kw)
    parted = assert_sequences_agree(cols_trace, rows_trace, model_rel_tol(lm))
    for s in seeds:
        for p, c, r in zip(prompts, cols[s], rows[s]):
            if rows_trace.get(0.7, p, s, 0.95)[0].key not in parted:
                assert (c.text, c.finish_reason, c.n_prompt_tokens, c.n_gen_tokens) == \
                    (r.text, r.finish_reason, r.n_prompt_tokens, r.n_gen_tokens)
    # decode steps: at most one cache row per prompt of the batch (4, then 2), five columns
    decode = [sh for sh in shapes if sh[1] == len(seeds)]
    assert decode and all(sh[0] <= 4 for sh in decode)
    # seeds stop at different steps (some stop early, some run to the limit)
    lengths = {g.n_gen_tokens for s in seeds for g in cols[s]}
    assert len(lengths) > 1 and max(lengths) == kw["max_new_tokens"]
    assert len({tuple(cols[s][0].token_ids) for s in seeds}) > 1


def test_stop_string_cuts_the_turn(lm):
    prompts = _prompts(lm, QUESTIONS[4:5])
    full = generate(lm, prompts, max_new_tokens=20, temperature=0)[0]
    words = full.text.split()
    assert len(words) >= 3, full.text
    marker = " " + words[2]
    cut_at = full.text.index(marker)
    stopping = dataclasses.replace(lm, stop_strings=[marker])
    g = generate(stopping, prompts, max_new_tokens=20, temperature=0)[0]
    assert g.finish_reason == "eos"
    assert g.text == full.text[:cut_at]
    assert g.n_gen_tokens < full.n_gen_tokens
    assert g.token_ids == full.token_ids[:g.n_gen_tokens]


def test_length_limit_and_progress_callback(lm):
    prompts = _prompts(lm)
    seen = []
    out = generate(lm, prompts, max_new_tokens=2, temperature=0, batch_size=4, progress=seen.append)
    assert all(g.n_gen_tokens <= 2 for g in out)
    assert all(g.finish_reason == "length" for g in out if g.n_gen_tokens == 2
               and g.token_ids[-1] not in lm.stop_ids)
    assert sum(seen) == len(prompts)
    assert generate(lm, [], max_new_tokens=2, temperature=0) == []
    with pytest.raises(ValueError):
        generate(lm, prompts, max_new_tokens=0, temperature=0)
    with pytest.raises(ValueError):
        generate(lm, prompts, max_new_tokens=2, temperature=0.5, top_p=0)
    with pytest.raises(TypeError):
        Progress(42, 1, "x")


def test_bf16_generation_runs_and_mostly_agrees(lm, lm_bf16):
    prompts = _prompts(lm)
    g32 = generate(lm, prompts, max_new_tokens=6, temperature=0)
    g16 = generate(lm_bf16, prompts, max_new_tokens=6, temperature=0)
    assert all(g.n_gen_tokens >= 1 for g in g16)
    # bf16 rounding may change a few tokens but not the first token of most answers
    assert sum(a.token_ids[0] == b.token_ids[0] for a, b in zip(g32, g16)) >= len(prompts) - 2


# --------------------------------------------------------------------------------------------
# scoring
# --------------------------------------------------------------------------------------------
def _mc(lm):
    stems = ["Which is a fruit? A) apple B) chair C) rock",
             "Is the sky green? A) yes B) no",
             "Pick the animal. A) table B) dog C) cloud D) spoon"]
    contexts = [format_prompt(lm.tokenizer, [{"role": "system", "content": SYSTEM},
                                             {"role": "user", "content": s}]) + "Answer: "
                for s in stems]
    candidates = [["A", "B", "C", "A) apple, the fruit"],
                  ["A) yes", "B) no"],
                  ["A", "B", "C", "D", "B) dog is an animal"]]
    return contexts, candidates


def _magnitude(lm, contexts, candidates):
    return logit_magnitude(lm, [c + x for c, xs in zip(contexts, candidates) for x in xs])


def test_kv_reuse_scores_equal_plain_fp32(lm):
    contexts, candidates = _mc(lm)
    fast = score_candidates(lm, contexts, candidates, batch_size=2)
    plain = score_candidates_plain(lm, contexts, candidates, batch_size=3)
    noprefix = score_candidates(lm, contexts, candidates, batch_size=2, prefix_cache=False)
    assert [len(r) for r in fast] == [len(c) for c in candidates]
    mag = _magnitude(lm, contexts, candidates)
    multi = 0
    for rf, rp, rn in zip(fast, plain, noprefix):
        for f, p, n in zip(rf, rp, rn):
            assert f.n_tokens == p.n_tokens == n.n_tokens
            tol = loglik_tol(lm, p.n_tokens, mag)
            assert f.loglik == pytest.approx(p.loglik, abs=tol)
            assert n.loglik == pytest.approx(p.loglik, abs=tol)
            assert f.is_greedy == p.is_greedy
            assert f.loglik < 0
            multi += f.n_tokens > 2
    assert multi >= 2
    # the score of a multi-token candidate is the sum of its conditional token log-probs
    tok = lm.tokenizer
    ctx_ids, cont_ids = encode_pair(tok, contexts[1], candidates[1][1])
    ids = torch.tensor([ctx_ids + cont_ids])
    with torch.inference_mode():
        logp = torch.log_softmax(lm.model(input_ids=ids).logits[0].float(), -1)
    manual = sum(float(logp[len(ctx_ids) - 1 + k, t]) for k, t in enumerate(cont_ids))
    assert fast[1][1].loglik == pytest.approx(manual, abs=loglik_tol(lm, len(cont_ids), mag))


def test_kv_reuse_scores_equal_plain_bf16(lm, lm_bf16):
    contexts, candidates = _mc(lm_bf16)
    fast = score_candidates(lm_bf16, contexts, candidates, batch_size=2)
    plain = score_candidates_plain(lm_bf16, contexts, candidates, batch_size=3)
    exact = score_candidates_plain(lm, contexts, candidates, batch_size=3)
    flat = lambda res: [x.loglik for r in res for x in r]  # noqa: E731
    tol = bf16_tolerance(flat(plain), flat(exact))
    assert 0 < tol < 1.0   # bf16 rounding moves these log-likelihoods, but not by a nat
    for rf, rp in zip(fast, plain):
        for f, p in zip(rf, rp):
            assert f.n_tokens == p.n_tokens
    # KV reuse moves a bf16 log-likelihood from the fp32 value no further than bf16 rounding
    # moves the plain path's (tests/numerics.py)
    for f, e in zip(flat(fast), flat(exact)):
        assert abs(f - e) <= tol


def test_scoring_runs_each_context_once(lm):
    contexts, candidates = _mc(lm)
    processed = []
    hook = lm.model.register_forward_pre_hook(
        lambda mod, args, kwargs: processed.append(kwargs["input_ids"].numel()), with_kwargs=True)
    try:
        score_candidates(lm, contexts, candidates, batch_size=1, prefix_cache=False)
    finally:
        hook.remove()
    tok = lm.tokenizer
    ctx_tokens = sum(len(encode_pair(tok, c, cs[0])[0]) for c, cs in zip(contexts, candidates))
    cont_tokens = sum(len(encode_pair(tok, c, x)[1]) - 1 for c, cs in zip(contexts, candidates)
                      for x in cs)
    # every context token once, every candidate token but its last once, nothing else
    assert sum(processed) == ctx_tokens + cont_tokens
    n_candidates = sum(len(cs) for cs in candidates)
    assert sum(processed) < n_candidates * min(len(encode_prompt(tok, c)) for c in contexts)


def test_greedy_continuation_is_flagged_greedy(lm):
    prompts = _prompts(lm, QUESTIONS[:1])
    g = generate(lm, prompts, max_new_tokens=4, temperature=0)[0]
    assert lm.tokenizer(g.text, add_special_tokens=False)["input_ids"] == g.token_ids[:4]
    score = score_candidates(lm, prompts, [[g.text, g.text + " zebra"]])[0]
    assert score[0].is_greedy and not score[1].is_greedy
    assert score[1].loglik < score[0].loglik


def test_nan_logits_raise_cell_error_naming_the_item(lm):
    check_finite(torch.tensor([-1.0, -2.5]), 0)
    with pytest.raises(CellError, match="item 7"):
        check_finite(torch.tensor([-1.0, float("nan")]), 7)
    with pytest.raises(CellError, match="item 2"):
        check_finite([-math.inf], 2)
    # a real model whose final norm is corrupted produces NaN logits end to end
    broken = dataclasses.replace(lm, model=copy.deepcopy(lm.model))
    with torch.no_grad():
        broken.model.model.norm.weight.fill_(float("nan"))
    contexts, candidates = _mc(lm)
    with pytest.raises(CellError, match="item 0"):
        score_candidates(broken, contexts[:1], candidates[:1])


def test_empty_candidate_or_prompt_is_rejected(lm):
    with pytest.raises(CellError, match="item 0: candidate 1"):
        score_candidates(lm, ["Question?"], [["yes", ""]])
    with pytest.raises(CellError, match="item 1: the prompt encodes to no tokens"):
        generate(lm, ["Hi", ""], max_new_tokens=2, temperature=0)


def test_out_of_memory_halves_the_batch_then_fails_clearly():
    from safetyrepro.inference.batching import Split

    calls = []

    def fn(rows):
        calls.append(list(rows))
        if len(rows) > 2 or 5 in rows:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return {r: r * 10 for r in rows}

    splits: list[Split] = []
    assert run_with_oom_fallback([0, 1, 2, 3, 6], fn, what="test", device="cuda",
                                 n_tokens=len, splits=splits) == {0: 0, 1: 10, 2: 20, 3: 30, 6: 60}
    # halves run in order, the first half split further before the second runs
    assert calls == [[0, 1, 2, 3, 6], [0, 1], [2, 3, 6], [2], [3, 6]]
    assert [(s.rows, s.into) for s in splits] == [((0, 1, 2, 3, 6), (2, 3)), ((2, 3, 6), (1, 2))]
    assert splits[0].as_dict()["batch_size"] == 5 and "out of memory" in splits[0].error
    with pytest.raises(CellError, match="out of memory on cuda during test even at batch size 1"):
        run_with_oom_fallback([4, 5], fn, what="test", device="cuda", n_tokens=len)
    with pytest.raises(RuntimeError, match="boom"):
        run_with_oom_fallback([1], lambda r: (_ for _ in ()).throw(RuntimeError("boom")),
                              what="t", device="cpu", n_tokens=len)


def _cache_tensors(cache) -> list[torch.Tensor]:
    out = []
    for layer in cache.layers:
        for name in ("_k", "_v", "keys", "values"):
            t = getattr(layer, name, None)
            if isinstance(t, torch.Tensor):
                out.append(t)
    return out


@pytest.mark.parametrize("columns", [True, False])
def test_out_of_memory_frees_the_failed_batch_before_the_retry_and_changes_no_output(lm, columns):
    """An out-of-memory error injected at a decode step of a batch of more than 3 prompts
    (its KV cache built and reserved): the batch is split, the failed attempt's cache, mask
    and logits are gone (weak references dead) when the first retry's forward starts, the
    split is recorded, and every stream's tokens equal the unsplit run's in fp32."""
    import weakref

    from safetyrepro.inference import Stream, generate_streams
    from safetyrepro.inference.batching import BatchRecord

    prompts = _prompts(lm)
    streams = [Stream(0.0), Stream(0.7, 1.0, 0), Stream(0.7, 0.9, 1)]
    kw = dict(max_new_tokens=5, batch_size=8, stream_columns=columns)
    with Trace().recording() as want:
        unsplit = generate_streams(lm, prompts, streams, **kw)
    failed: list[weakref.ref] = []
    alive_at_retry: list[int] = []
    state = {"decode_steps": 0, "raised": False}

    def inject(mod, args, kwargs):
        ids, cache = kwargs["input_ids"], kwargs[lm.cache_kwarg]
        if state["raised"] and not alive_at_retry:  # the first forward after the failure
            alive_at_retry.append(sum(r() is not None for r in failed))
        decoding = ids.shape[1] <= len(streams) and cache.get_seq_length() > 0
        if decoding and not state["raised"] and ids.shape[0] > 3:  # a cache row per prompt
            state["decode_steps"] += 1
            if state["decode_steps"] == 3:
                state["raised"] = True
                held = _cache_tensors(cache) + [kwargs["attention_mask"]]
                failed.extend(weakref.ref(t) for t in held)
                failed.append(weakref.ref(cache))
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB (injected)")

    record = BatchRecord()
    hook = lm.model.register_forward_pre_hook(inject, with_kwargs=True)
    try:
        with Trace().recording() as got_trace:
            got = generate_streams(lm, prompts, streams, record=record, **kw)
    finally:
        hook.remove()
    assert state["raised"] and len(failed) > 10
    assert alive_at_retry == [0], f"{alive_at_retry[0]} of the failed batch's tensors outlived it"
    assert [(s.what, len(s.rows), s.into) for s in record.splits] == [("generation", 6, (3, 3))]
    assert record.as_dict()["oom_splits"][0]["error"].startswith("OutOfMemoryError")
    # same outputs as the unsplit run (smaller batches: equal up to a fragile decision); the
    # failed attempt's first decode steps are in the trace too: the retry's come last
    failed_attempt = {key: seqs[:-1] for key, seqs in got_trace.sequences.items()}
    # (with repeated rows the first kind, greedy, was decoding when the error came)
    assert sum(map(len, failed_attempt.values())) == len(prompts) * (len(streams) if columns else 1)
    got_trace.sequences = {key: seqs[-1:] for key, seqs in got_trace.sequences.items()}
    parted = assert_sequences_agree(got_trace, want, model_rel_tol(lm))
    for st, a, b in zip(streams, got, unsplit):
        for p, x, y in zip(prompts, a, b):
            if want.get(st.temperature, p, st.seed, st.top_p)[0].key not in parted:
                assert x.token_ids == y.token_ids


@pytest.mark.parametrize("columns", [True, False])
def test_rows_leaving_in_place_change_no_output(lm, columns, monkeypatch):
    """Finished rows leave the decoding cache in place (kept rows moved into the holes, no
    copy of the cache); in fp32 every stream's tokens equal those of the row-selecting copy
    it replaced, with stream columns and with repeated rows."""
    import importlib

    from safetyrepro.inference import Stream, generate_streams

    decode_mod = importlib.import_module("safetyrepro.inference.decode")
    prompts = _prompts(lm)
    streams = [Stream(0.0), Stream(0.7, 1.0, 0), Stream(0.7, 1.0, 1)]
    kw = dict(max_new_tokens=10, batch_size=8, stream_columns=columns)
    monkeypatch.setattr(decode_mod, "IN_PLACE_DROP", False)
    with Trace().recording() as want:
        copied = generate_streams(lm, prompts, streams, **kw)
    monkeypatch.setattr(decode_mod, "IN_PLACE_DROP", True)
    with Trace().recording() as got_trace:
        moved = generate_streams(lm, prompts, streams, **kw)
    # rows did leave early (some sequences stopped before the limit)
    assert {g.n_gen_tokens for gs in moved for g in gs} != {kw["max_new_tokens"]}
    parted = assert_sequences_agree(got_trace, want, model_rel_tol(lm))
    for st, a, b in zip(streams, moved, copied):
        for p, x, y in zip(prompts, a, b):
            if want.get(st.temperature, p, st.seed, st.top_p)[0].key not in parted:
                assert (x.token_ids, x.finish_reason) == (y.token_ids, y.finish_reason)


@pytest.mark.parametrize("refill", [False, True])
def test_finished_streams_skip_the_feed_forward_blocks_and_change_no_output(lm, refill, monkeypatch):
    """Decode steps run each layer's feed-forward block only on the running streams' positions
    (finished streams' dummy columns are masked out of every other position's attention): in
    fp32 every stream's tokens equal those of the steps that ran it on every position, batch by
    batch and as a continuous batch."""
    import importlib

    from safetyrepro.inference import Stream, generate_streams
    from safetyrepro.inference.prefill import mlp_modules

    decode_mod = importlib.import_module("safetyrepro.inference.decode")
    prompts = _prompts(lm)
    streams = [Stream(0.0), Stream(0.7, 1.0, 0), Stream(0.7, 1.0, 1), Stream(0.3, 1.0, 2)]
    kw = dict(max_new_tokens=12, batch_size=4, refill=refill)
    mlps = mlp_modules(lm.model)
    assert len(mlps) == lm.model.config.num_hidden_layers
    fed_rows: list[list] = []   # [positions of the step, positions the FFN ran on] per forward

    def count(_mod, args, kwargs):
        fed_rows.append([kwargs["input_ids"].numel(), None])

    def ffn(_mod, args):
        if fed_rows and fed_rows[-1][1] is None:
            fed_rows[-1][1] = args[0].shape[:-1].numel()
    monkeypatch.setattr(decode_mod, "SKIP_UNREAD_FFN", False)
    with Trace().recording() as want:
        every = generate_streams(lm, prompts, streams, **kw)
    monkeypatch.setattr(decode_mod, "SKIP_UNREAD_FFN", True)
    hooks = [lm.model.register_forward_pre_hook(count, with_kwargs=True),
             mlps[0].down_proj.register_forward_pre_hook(ffn)]
    try:
        with Trace().recording() as got_trace:
            running = generate_streams(lm, prompts, streams, **kw)
    finally:
        for h in hooks:
            h.remove()
    # some steps had finished streams' columns, and their feed-forward ran on fewer positions
    assert any(ran < fed for fed, ran in fed_rows)
    assert all(ran <= fed for fed, ran in fed_rows)
    parted = assert_sequences_agree(got_trace, want, model_rel_tol(lm))
    for st, a, b in zip(streams, running, every):
        for p, x, y in zip(prompts, a, b):
            if want.get(st.temperature, p, st.seed, st.top_p)[0].key not in parted:
                assert (x.token_ids, x.finish_reason) == (y.token_ids, y.finish_reason)


def test_streams_with_equal_tokens_share_a_column_and_change_no_output(lm, monkeypatch):
    """A decode group's streams that have produced the same tokens so far (greedy and
    low-temperature samples often agree) feed one column per step: in fp32 every stream's
    tokens equal those of the steps that gave every running stream its own column (each
    stream still draws with its own generator), and the shared steps fed fewer positions."""
    import importlib

    from safetyrepro.inference import Stream, generate_streams
    from safetyrepro.inference.batching import BatchRecord

    decode_mod = importlib.import_module("safetyrepro.inference.decode")
    prompts = _prompts(lm)
    streams = [Stream(0.0)] + [Stream(0.3, 1.0, s) for s in range(3)] + [Stream(0.7, 1.0, 0)]
    kw = dict(max_new_tokens=12, batch_size=8)
    runs = {}
    for share in (False, True):
        monkeypatch.setattr(decode_mod, "SHARE_EQUAL_STREAMS", share)
        rec = BatchRecord()
        with fed_shapes(lm) as fed, Trace().recording() as trace:
            out = generate_streams(lm, prompts, streams, record=rec, **kw)
        runs[share] = (out, trace, rec.decode[0], fed)
    (own, want, d0, fed0), (shared, got, d1, fed1) = runs[False], runs[True]
    parted = assert_sequences_agree(got, want, model_rel_tol(lm))
    for st, a, b in zip(streams, shared, own):
        for p, x, y in zip(prompts, a, b):
            if want.get(st.temperature, p, st.seed, st.top_p)[0].key not in parted:
                assert (x.token_ids, x.finish_reason) == (y.token_ids, y.finish_reason)
    # the same tokens and steps; some took another stream's column, and the steps fed fewer
    # positions (one per distinct history, padded to the widest row)
    assert d1["tokens"] == d0["tokens"] and d1["forwards"] == d0["forwards"]
    assert d0["shared_tokens"] == 0 and d1["shared_tokens"] > 0
    assert d1["distinct"] + d1["shared_tokens"] == d1["tokens"]
    assert d1["token_slots"] < d0["token_slots"]
    decode = lambda fed: [w for r, w in fed if r <= len(prompts) and w <= len(streams)]
    assert sum(decode(fed1)) < sum(decode(fed0))


def test_refilled_rows_change_no_output_and_save_decode_steps(lm):
    """A decode group as a continuous batch (finished prompts' cache rows taken over by the
    next prompts of the queue, stream columns in a ring) against batch after batch: in fp32
    every stream's tokens agree under the rule of tests/numerics.py (greedy and sampled),
    the refill ran no more decode forwards (here each prompt keeps a sampled stream to the
    limit, so whole-batch rounds cost the same; benchmarks/bench_refill.py measures a group
    where lengths differ), and its rows' columns never grew past the first batch's."""
    from safetyrepro.inference import Stream, generate_streams
    from safetyrepro.inference.batching import BatchRecord

    prompts = _prompts(lm, QUESTIONS + ["Say hi.", "Count to three."])
    streams = [Stream(0.0), Stream(0.3, 1.0, 0), Stream(0.7, 1.0, 1)]
    kw = dict(max_new_tokens=10, batch_size=3)
    runs = {}
    for refill in (False, True):
        rec = BatchRecord()
        widths = []
        hook = lm.model.register_forward_pre_hook(
            lambda mod, args, kwargs: widths.append(kwargs["attention_mask"].shape[-1])
            if kwargs["input_ids"].shape[1] == len(streams) else None, with_kwargs=True)
        try:
            with Trace().recording() as trace:
                out = generate_streams(lm, prompts, streams, refill=refill, record=rec, **kw)
        finally:
            hook.remove()
        runs[refill] = (out, trace, rec.decode[0], widths)
    (base, want, d0, w0), (got_out, got, d1, w1) = runs[False], runs[True]
    assert d0["refill"] is False and d1["refill"] is True and d1["rows"] == 3
    parted = assert_sequences_agree(got, want, model_rel_tol(lm))
    for st, a, b in zip(streams, got_out, base):
        for p, x, y in zip(prompts, a, b):
            if want.get(st.temperature, p, st.seed, st.top_p)[0].key not in parted:
                assert (x.token_ids, x.finish_reason) == (y.token_ids, y.finish_reason)
    # the same useful tokens in fewer forwards; no row ever held more than the first batch's
    # columns (prompt columns + a ring of streams x max_new_tokens)
    assert d1["tokens"] == d0["tokens"] and d1["forwards"] <= d0["forwards"]
    # (the ring's first step sees the first batch's prompt columns and one block of stream
    # columns; it then never grows past T blocks. Batch by batch, a step feeds one column per
    # distinct history only, so those caches are narrower than the ring's.)
    assert max(w1) <= w1[0] + len(streams) * (kw["max_new_tokens"] - 1)
    assert max(w0) < max(w1)
    # rows were refilled: one decode run over the queue, the 8 prompts through 3 rows, each
    # step feeding every stream column of the 3 rows
    assert d1["token_slots"] <= d1["forwards"] * 3 * len(streams)
    assert d1["distinct"] == d1["tokens"] and d0["distinct"] <= d0["tokens"]
    assert {g.n_gen_tokens for gs in got_out for g in gs} != {kw["max_new_tokens"]}


def test_generation_batches_follow_the_memory_budget_and_are_recorded(lm):
    """A budget that holds two prompts' footprint makes batches of at most two prompts under
    a cap of 8; the plan (budget and every batch's prompts and footprint) is recorded, and
    the outputs equal the one-batch run's."""
    from safetyrepro.inference import Stream, generate_streams
    from safetyrepro.inference.batching import BatchRecord
    from safetyrepro.inference.memory import MemoryBudget, ModelDims

    prompts = _prompts(lm)
    streams = [Stream(0.0), Stream(0.3, 1.0, 0)]
    kw = dict(max_new_tokens=4, batch_size=8)
    with Trace().recording() as want:
        generate_streams(lm, prompts, streams, **kw)
    one = BatchRecord()
    generate_streams(lm, prompts, streams, record=one, **kw)
    (plan,) = one.plans
    assert [b["prompts"] for b in plan["batches"]] == [6]
    fp6 = plan["batches"][0]["footprint_bytes"]
    dims = ModelDims.of(lm)
    # room for about a third of the six-prompt batch: two prompts fit, three do not
    budget = MemoryBudget(total_bytes=10 * (fp6 // 3 + dims.weight_bytes + (1 << 30)) // 9,
                          weight_bytes=dims.weight_bytes, store_bytes=0)
    small = BatchRecord()
    with Trace().recording() as got:
        generate_streams(lm, prompts, streams, record=small, budget=budget, **kw)
    (plan,) = small.plans
    assert plan["budget"]["budget_bytes"] == budget.budget_bytes
    sizes = [b["prompts"] for b in plan["batches"]]
    assert sum(sizes) == 6 and max(sizes) == 2
    assert all(b["footprint_bytes"] <= budget.budget_bytes for b in plan["batches"])
    assert_sequences_agree(got, want, model_rel_tol(lm))
