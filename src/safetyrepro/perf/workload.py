"""Realistic benchmark workloads: a benchmark's items drawn exactly as a run draws them
(stratified subset + few-shot pool, :func:`safetyrepro.items.build.build_items`) but with any
item count, rendered into the prompts and candidates a cell would use (the same
``Task.build_messages`` / ``Task.logprob_request`` + ``format_prompt`` calls as
:mod:`safetyrepro.cells`)."""

from __future__ import annotations

import copy
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..config import RunConfig, config_from_dict
from ..grid import Config


@dataclass
class Workload:
    benchmark: str
    items: list[dict]
    fewshot: list[dict]  # the ordered few-shot pool (k-shot uses the first k)
    subset_hash: str


def load_workload(cfg: RunConfig, benchmark: str, n_items: int) -> Workload:
    """``n_items`` items of ``benchmark`` and its few-shot pool, selected by the run's own
    rules (data source and items seed of ``cfg``; only the item count differs). Built into a
    temporary folder, so the run's results are untouched."""
    from ..items import build_items, read_items

    raw = copy.deepcopy(cfg.raw)
    raw.setdefault("benchmarks", {}).setdefault(benchmark, {})
    raw["benchmarks"][benchmark] = {**raw["benchmarks"][benchmark], "n_items": int(n_items)}
    sized = config_from_dict(raw, cfg.path)
    with tempfile.TemporaryDirectory(prefix="safetyrepro-perf-") as tmp:
        summary = build_items(sized, benchmark, out_dir=Path(tmp))
        items, _ = read_items(summary["items_path"])
        pool, _ = read_items(summary["fewshot_path"])
    return Workload(benchmark, items.to_dict(orient="records"), pool.to_dict(orient="records"),
                    summary["subset_hash"])


def _shots(cfg: RunConfig, wl: Workload, config: Config) -> list[dict]:
    n = cfg.rules.level("shots", config.shots)["n"]
    return wl.fewshot[:n]


def freeform_prompts(cfg: RunConfig, lm, wl: Workload, config_id: str) -> list[str]:
    """The free-form prompts of cell ``config_id`` for every item (as ``cells`` renders them)."""
    from ..models import format_prompt
    from ..tasks import load_task

    c = Config.parse(config_id)
    task = load_task(wl.benchmark)
    shots = _shots(cfg, wl, c)
    return [format_prompt(lm.tokenizer, task.build_messages(it, c.template, shots)) for it in wl.items]


def logprob_requests(cfg: RunConfig, lm, wl: Workload, config_id: str
                     ) -> tuple[list[str], list[list[str]]]:
    """``(contexts, candidates)`` of logprob cell ``config_id``: the rendered chat context
    and the candidate continuations of every item."""
    from ..models import format_prompt
    from ..tasks import load_task

    c = Config.parse(config_id)
    task = load_task(wl.benchmark)
    shots = _shots(cfg, wl, c)
    contexts, cands = [], []
    for it in wl.items:
        messages, candidates = task.logprob_request(it, c.template, shots)
        contexts.append(format_prompt(lm.tokenizer, messages))
        cands.append(list(candidates))
    return contexts, cands
