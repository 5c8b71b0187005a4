"""What a cell asks of the model: its items, template, few-shot exemplars and scoring path
turned into model requests (the project's counterpart of lm-eval's ``Instance``).

Free-form: one chat-formatted prompt per item (:meth:`.tasks.Task.build_messages`) up to
``max_new_tokens``; logprob: one context and its candidate continuations per item
(:meth:`.tasks.Task.logprob_request`). The cells and the benchmark workloads
(:mod:`.perf.workload`) both build requests here, so a benchmark measures what a run sends."""

from __future__ import annotations

from dataclasses import dataclass

from .config import RunConfig
from .errors import CellError
from .grid import Config


@dataclass(frozen=True)
class FreeformRequests:
    """Generate from each prompt (one per item) up to ``max_new_tokens`` tokens."""
    prompts: list[str]
    max_new_tokens: int
    batch_size: int


@dataclass(frozen=True)
class LogprobRequests:
    """Score each item's candidate continuations of its context."""
    contexts: list[str]
    candidates: list[list[str]]
    batch_size: int


def fewshot_exemplars(cfg: RunConfig, shots: str, pool: list[dict]) -> list[dict]:
    """The first n exemplars of the ordered few-shot ``pool`` for shots level ``shots``."""
    n = cfg.rules.level("shots", shots)["n"]
    if n > len(pool):
        raise CellError(f"{n} shots requested but the few-shot pool has {len(pool)}")
    return pool[:n]


def freeform_prompts(tokenizer, task, items: list[dict], template: str, exemplars: list[dict]) -> list[str]:
    from .models import format_prompt

    return [format_prompt(tokenizer, task.build_messages(it, template, exemplars)) for it in items]


def logprob_contexts(tokenizer, task, items: list[dict], template: str, exemplars: list[dict]
                     ) -> tuple[list[str], list[list[str]]]:
    """``(contexts, candidates)``: each item's rendered chat context and its candidates."""
    from .models import format_prompt

    contexts, cands = [], []
    for it in items:
        messages, candidates = task.logprob_request(it, template, exemplars)
        contexts.append(format_prompt(tokenizer, messages))
        cands.append(list(candidates))
    return contexts, cands


def cell_requests(cfg: RunConfig, tokenizer, task, config: Config, items: list[dict],
                  pool: list[dict]) -> FreeformRequests | LogprobRequests:
    """The requests of cell ``config`` of ``task``'s benchmark over ``items``, with exemplars
    from the few-shot ``pool`` and the run's generation settings."""
    exemplars = fewshot_exemplars(cfg, config.shots, pool)
    batch_size = cfg.data["generation"]["batch_size"]
    if config.scoring == "freeform":
        return FreeformRequests(freeform_prompts(tokenizer, task, items, config.template, exemplars),
                                cfg.max_new_tokens(task.benchmark, config.template), batch_size)
    contexts, cands = logprob_contexts(tokenizer, task, items, config.template, exemplars)
    return LogprobRequests(contexts, cands, batch_size)
