"""Benchmark tasks as data: one YAML file per benchmark in this folder.

Each file (schema: config/schema/task.schema.json) declares the benchmark's templates (T1..T4,
or any ids it likes; the envelope rules pick which the grid uses), how options are shown, the
answer format, the logprob candidates, the free-form parser and the scoring rule. See
docs/SCORING.md.

Public API::

    load_task(benchmark) -> Task            (cached)
    load_task_file(path) -> Task            (not cached; for edited copies)
    known_benchmarks() -> list[str]
    Task.template_ids, Task.template_hash(tid), Task.scoring_paths, Task.parser_version
    Task.build_messages(item, tid, fewshot) -> [{"role", "content"}, ...]
    Task.logprob_request(item, tid, fewshot) -> (messages, candidates)
    Task.score_freeform(item, text) / Task.score_logprob(item, logliks, n_tokens) -> ItemResult
    Task.summarize(results, items) -> {"score", "score_num", "score_den", "parse_rate", "n_items", "n_parsed", "extras"}
"""

from .loader import known_benchmarks, load_task, load_task_file, score_is_item_mean
from .scoring import ItemResult
from .task import Task

__all__ = ["ItemResult", "Task", "known_benchmarks", "load_task", "load_task_file", "score_is_item_mean"]
