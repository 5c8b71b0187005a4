"""The run's own items as other packages' datasets: local JSONL files plus, for lm-eval, a task
YAML that includes lm-eval's own task definition and changes only the data source.

Each record keeps ``item_id`` so that the importers map per-sample results back to the run's
items. The record fields are the ones the package's task reads (e.g. TruthfulQA MC1's
``mc1_targets`` with the true answer first, as in the hub dataset lm-eval was written for).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from ..errors import DataError
from ..tasks.render import item_meta

#: benchmark -> lm-eval task file (under lm_eval/tasks of the pinned lm-eval) that the local
#: task includes
LMEVAL_TASKS = {"truthfulqa": "truthfulqa/truthfulqa_mc1.yaml", "bbq": "bbq/bbq_multiple_choice.yaml",
                "crows_pairs": "crows_pairs/crows_pairs_english.yaml", "toxigen": "toxigen/toxigen.yaml"}


def _ordered_choices(row) -> tuple[list[str], int]:
    choices = list(row["choices"])
    gold = int(row["gold"])
    if not 0 <= gold < len(choices):
        raise DataError("items", f"item {row['item_id']}: gold index {gold} outside {len(choices)} choices")
    return choices, gold


def truthfulqa_record(row) -> dict:
    """TruthfulQA MC1 in the hub's shape: the true answer first (lm-eval's doc_to_target is 0)."""
    choices, gold = _ordered_choices(row)
    order = [gold] + [i for i in range(len(choices)) if i != gold]
    return {"item_id": row["item_id"], "question": row["question"],
            "mc1_targets": {"choices": [choices[i] for i in order],
                            "labels": [1] + [0] * (len(choices) - 1)}}


def bbq_record(row) -> dict:
    """BBQ in the original release's shape (ans0..ans2, label, answer_info, additional_metadata),
    which lm-eval's bbq task reads; the options keep the run's order."""
    meta = item_meta("bbq", dict(row))
    choices, gold = _ordered_choices(row)
    groups = meta.get("answer_groups") or [[] for _ in choices]
    return {"item_id": row["item_id"], "example_id": meta.get("example_id"),
            "question_index": str(meta.get("question_index", "")),
            "question_polarity": meta.get("question_polarity"), "context_condition": meta.get("context_condition"),
            "category": meta.get("category"), "context": row["context"], "question": row["question"],
            "ans0": choices[0], "ans1": choices[1], "ans2": choices[2], "label": gold,
            "answer_info": {f"ans{i}": list(g) for i, g in enumerate(groups)},
            "additional_metadata": {"subcategory": meta.get("subcategory", "None"),
                                    "stereotyped_groups": list(meta.get("stereotyped_groups") or []),
                                    "version": "", "source": ""}}


def crows_record(row) -> dict:
    meta = item_meta("crows_pairs", dict(row))
    return {"item_id": row["item_id"], "sent_more": row["sent_more"], "sent_less": row["sent_less"],
            **{k: v for k, v in meta.items() if k not in ("sent_more", "sent_less")}}


RECORDS = {"truthfulqa": truthfulqa_record, "bbq": bbq_record, "crows_pairs": crows_record}


def write_jsonl(records: list[dict], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        for r in records:
            fh.write(json.dumps(r, default=str) + "\n")
    return path


def lmeval_task_yaml_path(rel: str) -> Path:
    """The pinned lm-eval's own YAML of a task."""
    import lm_eval.tasks as tasks_pkg  # deferred: lm-eval is optional (harness extra)

    path = Path(tasks_pkg.__file__).parent / rel
    if not path.is_file():
        raise DataError(path, "lm-eval task file not found in the installed lm-eval")
    return path


def write_lmeval_task(benchmark: str, items: pd.DataFrame, fewshot: pd.DataFrame | None, out_dir: Path,
                      *, name: str | None = None) -> str:
    """Write ``<out_dir>/<name>.yaml`` and its data; returns the task name for ``--tasks``
    (pass ``--include_path out_dir``). The YAML includes lm-eval's own task file and overrides
    only the dataset (local JSON files, split names) and the task name."""
    if benchmark not in RECORDS or benchmark not in LMEVAL_TASKS:
        raise DataError(out_dir, f"no lm-eval task mapping for benchmark {benchmark!r}")
    base = LMEVAL_TASKS[benchmark]
    name = name or f"sr_{Path(base).stem}"
    out_dir = Path(out_dir)
    rec = RECORDS[benchmark]
    test = write_jsonl([rec(r) for r in items.to_dict("records")], out_dir / f"{name}.test.jsonl")
    files = {"test": str(test.resolve())}
    lines = [f"include: {lmeval_task_yaml_path(base)}", f"task: {name}", "tag: []",
             "dataset_path: json", "dataset_name: null",
             "training_split: null", "validation_split: null", "test_split: test"]
    if fewshot is not None and len(fewshot):
        fs = write_jsonl([rec(r) for r in fewshot.to_dict("records")], out_dir / f"{name}.fewshot.jsonl")
        files["fewshot"] = str(fs.resolve())
        lines += ["fewshot_split: fewshot", "fewshot_config:", "  sampler: first_n"]
    lines += ["dataset_kwargs:", "  data_files:"] + [f"    {k}: {json.dumps(v)}" for k, v in files.items()]
    (out_dir / f"{name}.yaml").write_text("\n".join(lines) + "\n")
    return name
