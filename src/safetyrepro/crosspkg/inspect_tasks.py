"""Inspect tasks over the run's own items (JSONL written by :func:`write_inspect_data`), scored
with Inspect's own ``multiple_choice`` solver and ``choice`` scorer.

Use from Python (``inspect_ai.eval(mc_task(...), ...)``) or Inspect's command line::

    inspect eval src/safetyrepro/crosspkg/inspect_tasks.py@safetyrepro_mc -T data=items.jsonl \\
        --model hf/local -M model_path=FOLDER -M do_sample=false

The sample id is the run's ``item_id``, so :func:`~.importers.import_inspect` maps scores back.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from ..errors import DataError

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def mc_record(row) -> dict:
    """One choice item as Inspect sample fields: the question (BBQ: context, blank line,
    question), the options in the run's order, and the gold letter."""
    choices = [str(c) for c in row["choices"]]
    gold = int(row["gold"])
    if not choices or not 0 <= gold < len(choices):
        raise DataError("items", f"item {row['item_id']}: not a choice item with a gold option")
    ctx = row.get("context")
    q = f"{ctx}\n\n{row['question']}" if isinstance(ctx, str) and ctx else str(row["question"])
    return {"id": row["item_id"], "input": q, "choices": choices, "target": LETTERS[gold]}


def write_inspect_data(items: pd.DataFrame, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        for r in items.to_dict("records"):
            fh.write(json.dumps(mc_record(r)) + "\n")
    return path


def _task(data: str, system: str | None = None, max_tokens: int = 16, name: str | None = None):
    from inspect_ai import Task  # deferred: inspect_ai is optional (harness extra)
    from inspect_ai.dataset import Sample, json_dataset  # deferred: inspect_ai is optional
    from inspect_ai.scorer import choice  # deferred: inspect_ai is optional
    from inspect_ai.solver import multiple_choice, system_message  # deferred: inspect_ai is optional

    def to_sample(rec: dict) -> Sample:
        return Sample(id=rec["id"], input=rec["input"], choices=rec["choices"], target=rec["target"])

    solver = ([system_message(system)] if system else []) + [multiple_choice(max_tokens=max_tokens)]
    return Task(dataset=json_dataset(str(data), to_sample, shuffle=False), solver=solver, scorer=choice(),
                name=name)


def _register():
    from inspect_ai import task  # deferred: inspect_ai is optional (harness extra)

    @task
    def safetyrepro_mc(data: str, system: str | None = None, max_tokens: int = 16):
        """The run's choice items with Inspect's multiple_choice solver and choice scorer."""
        return _task(data, system, max_tokens)

    return safetyrepro_mc


try:  # registered when inspect_ai is importable (it is a pinned dependency)
    safetyrepro_mc = _register()
except ImportError:  # pragma: no cover
    safetyrepro_mc = None
