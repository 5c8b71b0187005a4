"""Benchmark tasks as data: one YAML file per benchmark in this folder.

Each file (schema: data/schema/task.schema.json) declares the benchmark's templates (T1..T4,
or any ids it likes; the envelope rules pick which the grid uses), how options are shown, the
answer format, the logprob candidates, the free-form parser and the scoring rule. See
docs/SCORING.md.

Public API::

    load_task(benchmark) -> Task            (cached)
    load_task_file(path) -> Task            (not cached; for edited copies)
    known_benchmarks() -> list[str]
    parse_response(benchmark, text, item), parser_version(benchmark)
    Task = TaskPrompts (prompt side, tasks/prompts.py) + parsing and scoring (tasks/task.py):
    Task.template_ids, Task.template_hash(tid), Task.scoring_paths, Task.parser_version
    Task.build_messages(item, tid, fewshot) -> [{"role", "content"}, ...]
    Task.logprob_request(item, tid, fewshot) -> (messages, candidates)
    Task.score_freeform(item, text) / Task.score_logprob(item, logliks, n_tokens) -> ItemResult
    Task.summarize(results, items) -> {"score", "score_num", "score_den", "parse_rate", "n_items", "n_parsed", "extras"}
"""

from .loader import known_benchmarks, load_task, load_task_file, score_is_item_mean
from .prompts import TaskPrompts
from .scoring import ItemResult
from .task import Task


def parse_response(benchmark: str, text: object, item: dict | None = None):
    """Parse one free-form response of ``benchmark`` (a :class:`~safetyrepro.parsing.ParseResult`).
    With ``item`` (a canonical item row), multiple-choice parsing is limited to that item's
    letters and also recognises an answer given as an option's text. Never raises on any
    ``text``."""
    return load_task(benchmark).parse(text, item)


def parser_version(benchmark: str) -> str:
    """Content hash of the code and task-file sections that map ``benchmark``'s raw outputs
    (free-form text or candidate log-likelihoods) to scored results."""
    return load_task(benchmark).parser_version


__all__ = ["ItemResult", "Task", "TaskPrompts", "known_benchmarks", "load_task", "load_task_file",
           "parse_response", "parser_version", "score_is_item_mean"]
