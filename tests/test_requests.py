"""requests.cell_requests on real items and the real SmolLM2 tokenizer (no model weights
loaded): what a free-form and a logprob cell ask of the model, and the few-shot check."""

from __future__ import annotations

import pytest

from safetyrepro.errors import CellError
from safetyrepro.grid import Config
from safetyrepro.models import format_prompt
from safetyrepro.requests import FreeformRequests, LogprobRequests, cell_requests, fewshot_exemplars
from safetyrepro.tasks import load_task
from shard_synth import items_of, synthetic_run


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from transformers import AutoTokenizer

    from safetyrepro.models.prepare import prepare_model

    plan = synthetic_run(tmp_path_factory.mktemp("req"))
    tok = AutoTokenizer.from_pretrained(str(prepare_model(plan.cfg, "m-nf4", progress=False)))
    items, _ = items_of(plan, "truthfulqa")
    df_pool = plan.layout.fewshot_path("truthfulqa")
    from safetyrepro.items import read_items

    pool = read_items(df_pool)[0].to_dict(orient="records")
    return plan, tok, items, pool


def test_freeform_requests_are_the_rendered_prompts_with_generation_settings(setup):
    plan, tok, items, pool = setup
    task = load_task("truthfulqa")
    req = cell_requests(plan.cfg, tok, task, Config.parse("T4-t0.7-k3-freeform"), items, pool)
    assert isinstance(req, FreeformRequests) and len(req.prompts) == len(items)
    assert req.prompts[1] == format_prompt(tok, task.build_messages(items[1], "T4", pool[:3]))
    assert req.max_new_tokens == plan.cfg.max_new_tokens("truthfulqa", "T4") == 16
    assert req.batch_size == plan.cfg.data["generation"]["batch_size"] == 8


def test_logprob_requests_are_contexts_and_candidates(setup):
    plan, tok, items, pool = setup
    task = load_task("truthfulqa")
    req = cell_requests(plan.cfg, tok, task, Config.parse("T1-greedy-k0-logprob"), items, pool)
    assert isinstance(req, LogprobRequests)
    messages, candidates = task.logprob_request(items[2], "T1", [])
    assert req.contexts[2] == format_prompt(tok, messages) and req.candidates[2] == list(candidates)
    assert len(req.candidates) == len(items) and all(len(c) >= 2 for c in req.candidates)


def test_more_shots_than_the_pool_holds_is_refused(setup):
    plan, tok, items, pool = setup
    assert fewshot_exemplars(plan.cfg, "k3", pool) == pool[:3]
    with pytest.raises(CellError, match="3 shots requested but the few-shot pool has 2"):
        fewshot_exemplars(plan.cfg, "k3", pool[:2])
