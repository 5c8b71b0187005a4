"""The memory footprint model and batch planner of generation (``safetyrepro.inference.memory``):
no model is loaded; the dimensions are those of a small GQA model and of Qwen2.5-7B's config."""

from __future__ import annotations

import pytest

from safetyrepro.inference.batching import length_batches
from safetyrepro.inference.memory import (MEMORY_FRACTION, RESERVE_BYTES, MemoryBudget, ModelDims,
                                          generation_footprint, max_rows, plan_batches)

GIB = 1 << 30
QWEN7B = ModelDims(layers=28, hidden=3584, intermediate=18944, q_heads=28, kv_heads=4,
                   head_dim=128, vocab=152064, act_bytes=2, weight_bytes=int(5.5 * GIB))


def _fp(**kw):
    base = dict(rows=8, width=600, prefix=900, detached=False, streams=11, max_new_tokens=256,
                columns=True, largest_kind=5)
    return generation_footprint(QWEN7B, **(base | kw))


def test_kv_bytes_per_token():
    assert QWEN7B.kv_token_bytes == 2 * 28 * 4 * 128 * 2  # keys and values, every layer


def test_footprint_grows_with_every_dimension_of_the_batch():
    ref = _fp()
    for kw in (dict(rows=9), dict(width=700), dict(prefix=1000), dict(streams=12),
               dict(max_new_tokens=300)):
        assert _fp(**kw) > ref, kw
    # a detached prefix is not copied into the batch rows
    assert _fp(detached=True) < ref
    # the reserved decode buffers: one column per stream and step in each prompt's row
    more = _fp(max_new_tokens=257) - ref
    assert more >= 8 * 11 * QWEN7B.kv_token_bytes
    # repeated rows hold the prompt once per stream of the largest kind
    assert _fp(columns=False, largest_kind=5) > _fp(columns=False, largest_kind=1)


def test_grouped_heads_drop_the_per_head_key_value_copies_from_the_footprint():
    """With grouped heads (no ``repeat_kv``) a stream-column decode step holds a folded mask
    instead of 7 copies of every layer's keys/values (Qwen2.5-7B: 28 query heads on 4)."""
    ref, grouped = _fp(), _fp(grouped=True)
    cols = 600 + 900 + 11 * 256
    copies = 2 * 8 * QWEN7B.q_heads * cols * QWEN7B.head_dim * QWEN7B.act_bytes
    folded_mask = 8 * 11 * 7 * cols * (1 + QWEN7B.act_bytes)
    assert ref - grouped == copies - folded_mask  # the decode step is the larger phase here
    # one query per row (repeated rows): nothing is folded or copied with grouped heads
    assert _fp(columns=False, grouped=True) < _fp(columns=False)


def test_budget_is_a_function_of_total_memory_weights_and_store():
    b = MemoryBudget(total_bytes=80 * GIB, weight_bytes=6 * GIB, store_bytes=2 * GIB)
    assert b.budget_bytes == int(80 * GIB * MEMORY_FRACTION) - 8 * GIB - RESERVE_BYTES
    assert b.record()["budget_bytes"] == b.budget_bytes and b.record()["total_bytes"] == 80 * GIB
    assert MemoryBudget(24 * GIB, 6 * GIB, 2 * GIB).budget_bytes < b.budget_bytes


def test_plan_with_room_for_the_cap_is_the_length_sorted_batching():
    lengths = [5, 9, 9, 3, 12, 7, 7, 1, 4, 8]
    plan = plan_batches(lengths, 4, lambda rows, width: rows * width, budget=10**9)
    assert [b for b, _ in plan] == length_batches(lengths, 4)
    assert [f for _, f in plan] == [4 * 12, 4 * 7, 2 * 3]  # each batch at its longest prompt


def test_plan_closes_a_batch_when_the_next_prompt_would_not_fit():
    lengths = [10, 50, 20, 20, 40, 10, 30]
    calls = []

    def fp(rows, width):
        calls.append((rows, width))
        return rows * width * 10

    plan = plan_batches(lengths, 8, fp, budget=1000)
    assert [b for b, _ in plan] == [[1, 4], [6, 2, 3], [0, 5]]
    assert all(f <= 1000 for _, f in plan)
    assert sorted(i for b, _ in plan for i in b) == list(range(len(lengths)))
    # deterministic: the same inputs give the same plan
    assert plan_batches(lengths, 8, fp, budget=1000) == plan
    # a prompt that alone exceeds the budget still runs, alone (and the plan says so)
    plan = plan_batches([200, 5, 5], 8, fp, budget=1000)
    assert plan[0] == ([0], 2000) and plan[1][0] == [1, 2]
    with pytest.raises(ValueError, match="batch_size"):
        plan_batches([1], 0, fp, budget=1)


def test_qwen7b_t4_decode_group_fits_fewer_prompts_on_a_smaller_card():
    """The paper's heaviest decode group (five-shot T4: 11 streams of 256 tokens): the planner
    takes fewer prompts per batch on a 24 GB card than on an 80 GB one, never more than the
    cap."""
    def rows_on(total):
        budget = MemoryBudget(total, QWEN7B.weight_bytes, 2 * GIB).budget_bytes
        return max_rows(lambda r: _fp(rows=r, width=300, prefix=1200), budget, cap=32)

    small, large = rows_on(24 * GIB), rows_on(80 * GIB)
    assert 1 <= small < large <= 32
