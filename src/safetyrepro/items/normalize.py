"""Turn one source row of a benchmark into a canonical item record (see schema.py).

The functions are pure and shared by the local loaders (loaders.py) and the hub loaders
(hub.py), so both sources produce identical items. ``where`` names the source (a file path or
``hub:<id>/<config>:<split>``) and ``row`` the 1-based record in it, for the DataError a
malformed row raises. The comment above each benchmark's function gives its encoding.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from ..errors import DataError
from .schema import TOXIGEN_TEST_SIZE, dump_meta
from .seeding import permutation


def _text(value: Any, field: str, where: str, row: int, *, optional: bool = False) -> str | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        if optional:
            return None
        raise DataError(where, f"field '{field}' is missing", row=row)
    if not isinstance(value, str):
        raise DataError(where, f"field '{field}' must be text, got {type(value).__name__}",
                        row=row)
    if not optional and not value.strip():
        raise DataError(where, f"field '{field}' is empty", row=row)
    return value


def _int(value: Any, field: str, where: str, row: int) -> int:
    if isinstance(value, bool):
        raise DataError(where, f"field '{field}' must be an integer, got {value!r}", row=row)
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    raise DataError(where, f"field '{field}' must be an integer, got {value!r}", row=row)


def _number(value: Any, field: str, where: str, row: int) -> float:
    try:
        out = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        out = math.nan
    if math.isnan(out):
        raise DataError(where, f"field '{field}' must be a number, got {value!r}", row=row)
    return out


def _require(rec: Mapping, keys: Sequence[str], where: str, row: int) -> None:
    if not isinstance(rec, Mapping):
        raise DataError(where, f"expected an object, got {type(rec).__name__}", row=row)
    missing = [k for k in keys if k not in rec]
    if missing:
        raise DataError(where, f"missing field(s) {', '.join(missing)}", row=row)


def _item(*, item_id: str, benchmark: str, split: str, stratum: str, meta: dict,
          question=None, context=None, text=None, choices=(), gold=-1, label=None,
          **extra) -> dict:
    return {"item_id": item_id, "benchmark": benchmark, "split": split, "question": question,
            "context": context, "text": text, "choices": list(choices), "gold": int(gold),
            "label": label, "meta": dump_meta(meta), "stratum": stratum, **extra}


# ---------------------------------------------------------------------------- truthfulqa
# MC1: ``choices`` = the mc1 options shuffled with a per-item seed (sha256 of items_seed +
# item_id); ``gold`` = the position of the single true option. meta: ``permutation``
# (``choices[j] == original[permutation[j]]``; the original order lists the true answer
# first), ``original_gold``, ``source_index``, ``mc2_targets`` {choices, labels} in original order.
def truthfulqa_item(index: int, question: Any, mc1_choices: Sequence, mc1_labels: Sequence,
                    *, items_seed: int, where: str, row: int,
                    mc2_choices: Sequence | None = None,
                    mc2_labels: Sequence | None = None) -> dict:
    question = _text(question, "question", where, row)
    choices = [_text(c, "mc1_targets choice", where, row) for c in mc1_choices]
    labels = [_int(v, "mc1_targets label", where, row) for v in mc1_labels]
    if len(choices) != len(labels):
        raise DataError(where, "mc1_targets: choices and labels differ in length", row=row)
    if len(choices) < 2:
        raise DataError(where, f"mc1_targets: needs at least 2 choices, has {len(choices)}",
                        row=row)
    if sorted(set(labels)) != [0, 1] or labels.count(1) != 1:
        raise DataError(where, f"mc1_targets: needs exactly one choice labelled 1 and the "
                               f"rest 0, got labels {labels}", row=row)
    if len(set(choices)) != len(choices):
        raise DataError(where, "mc1_targets: duplicate choices", row=row)
    item_id = f"truthfulqa/{index}"
    original_gold = labels.index(1)
    perm = permutation(len(choices), "truthfulqa-choices", items_seed, item_id)
    meta = {"source_index": index, "permutation": perm, "original_gold": original_gold,
            "mc2_targets": {"choices": list(mc2_choices or []),
                            "labels": [int(v) for v in (mc2_labels or [])]}}
    return _item(item_id=item_id, benchmark="truthfulqa", split="validation", stratum="all",
                 question=question, choices=[choices[p] for p in perm],
                 gold=perm.index(original_gold), meta=meta)


# ---------------------------------------------------------------------------------- bbq
# ``context``, ``question``, ``choices`` = [ans0, ans1, ans2], ``gold`` = label. meta:
# ``category``, ``context_condition`` (ambig/disambig), ``question_polarity`` (neg/nonneg),
# ``unknown_index``, ``target_index``, ``biased_index``, ``example_id``, ``question_index``,
# ``subcategory``, ``stereotyped_groups``, ``answer_groups``. target_index: the non-unknown
# answer whose answer_info entry (name or tag, case-insensitive) is a stereotyped group,
# whatever the polarity; null when both or neither match. It approximates the official
# target_loc (additional_metadata.csv is not available; PROVENANCE.md). biased_index (Parrish
# et al. 2022): the target for a ``neg`` question, the other non-unknown answer for a
# ``nonneg`` one; null when target_index is null.
BBQ_FIELDS = ("example_id", "question_polarity", "context_condition", "category",
              "answer_info", "additional_metadata", "context", "question", "ans0", "ans1",
              "ans2", "label")


def _norm_group(s: str) -> str:
    return " ".join(str(s).lower().split())


def bbq_target_index(answer_info: Sequence[Sequence[str]], stereotyped_groups: Sequence[str],
                     unknown_index: int) -> int | None:
    """Index of the answer naming a stereotyped group (see the bbq comment above), or None."""
    groups = {_norm_group(g) for g in stereotyped_groups}
    hits = [i for i, entry in enumerate(answer_info)
            if i != unknown_index and any(_norm_group(x) in groups for x in entry)]
    return hits[0] if len(hits) == 1 else None


def bbq_item(rec: Mapping, *, where: str, row: int, category: str | None = None) -> dict:
    _require(rec, BBQ_FIELDS, where, row)
    cat = _text(rec["category"], "category", where, row)
    if category is not None and cat != category:
        raise DataError(where, f"category {cat!r} in a file/config for {category!r}", row=row)
    example_id = _int(rec["example_id"], "example_id", where, row)
    cond = rec["context_condition"]
    if cond not in ("ambig", "disambig"):
        raise DataError(where, f"context_condition must be ambig or disambig, got {cond!r}",
                        row=row)
    pol = rec["question_polarity"]
    if pol not in ("neg", "nonneg"):
        raise DataError(where, f"question_polarity must be neg or nonneg, got {pol!r}", row=row)
    choices = [_text(rec[f"ans{i}"], f"ans{i}", where, row) for i in range(3)]
    gold = _int(rec["label"], "label", where, row)
    if not 0 <= gold <= 2:
        raise DataError(where, f"label must be 0, 1 or 2, got {gold}", row=row)
    info = rec["answer_info"]
    if not isinstance(info, Mapping) or any(
            not isinstance(info.get(f"ans{i}"), (list, tuple)) or len(info[f"ans{i}"]) < 2
            for i in range(3)):
        raise DataError(where, "answer_info must map ans0..ans2 to [name, tag]", row=row)
    entries = [[str(x) for x in info[f"ans{i}"]] for i in range(3)]
    unknown = [i for i, e in enumerate(entries) if e[1] == "unknown"]
    if len(unknown) != 1:
        raise DataError(where, f"answer_info must tag exactly one answer 'unknown', "
                               f"found {len(unknown)}", row=row)
    unknown_index = unknown[0]
    am = rec["additional_metadata"]
    if not isinstance(am, Mapping) or not isinstance(am.get("stereotyped_groups"),
                                                     (list, tuple)):
        raise DataError(where, "additional_metadata.stereotyped_groups must be a list",
                        row=row)
    groups = [str(g) for g in am["stereotyped_groups"]]
    target = bbq_target_index(entries, groups, unknown_index)
    if target is None:
        biased = None
    elif pol == "neg":
        biased = target
    else:
        biased = next(i for i in range(3) if i not in (target, unknown_index))
    meta = {"category": cat, "context_condition": cond, "question_polarity": pol,
            "unknown_index": unknown_index, "target_index": target, "biased_index": biased,
            "example_id": example_id, "question_index": str(rec.get("question_index")),
            "subcategory": am.get("subcategory"), "stereotyped_groups": groups,
            "answer_groups": entries}
    return _item(item_id=f"bbq/{cat}/{example_id}", benchmark="bbq", split="test",
                 stratum=f"{cat}/{cond}", context=_text(rec["context"], "context", where, row),
                 question=_text(rec["question"], "question", where, row), choices=choices,
                 gold=gold, meta=meta)


# ------------------------------------------------------------------------------ toxigen
# ``text`` = the statement (stripped), ``choices`` = [], ``gold`` = -1, ``label`` = toxic /
# benign. meta: ``source_id``, ``target_groups``, ``toxicity_score`` (toxicity_human, 1-5),
# ``source_label``, ``label_rule``. Local (SafeNLP toxiGen.json): toxic iff label == "hate";
# hub: toxic iff toxicity_ai + toxicity_human > 5.5 (lm-eval's rule), so the sources differ
# on some items.
def toxigen_item(source_id: Any, text: Any, toxic: bool, target_groups: Sequence,
                 toxicity_score: Any, *, source_label: str, label_rule: str, where: str,
                 row: int, extra_meta: Mapping | None = None) -> dict:
    sid = _int(source_id, "id", where, row)
    if sid < 0:
        raise DataError(where, f"id must be >= 0, got {sid}", row=row)
    text = _text(text, "text", where, row).strip()
    if not isinstance(target_groups, (list, tuple)) or not all(
            isinstance(g, str) for g in target_groups):
        raise DataError(where, f"target_groups must be a list of strings, got "
                               f"{target_groups!r}", row=row)
    score = _number(toxicity_score, "toxicity_score", where, row)
    label = "toxic" if toxic else "benign"
    meta = {"source_id": sid, "target_groups": list(target_groups), "toxicity_score": score,
            "source_label": source_label, "label_rule": label_rule, **(extra_meta or {})}
    return _item(item_id=f"toxigen/{sid}", benchmark="toxigen",
                 split="test" if sid < TOXIGEN_TEST_SIZE else "train", stratum=label,
                 text=text, label=label, meta=meta)


# -------------------------------------------------------------------------- crows_pairs
# ``sent_more``/``sent_less`` columns (sent_more is the more stereotypical sentence in both
# directions), ``choices`` = [], ``gold`` = -1, label null. meta: ``sent_more``,
# ``sent_less``, ``stereo_antistereo``, ``bias_type``, ``source_index``.
def crows_item(index: Any, sent_more: Any, sent_less: Any, direction: Any, bias_type: Any,
               *, where: str, row: int) -> dict:
    idx = _int(index, "id", where, row)
    more = _text(sent_more, "sent_more", where, row)
    less = _text(sent_less, "sent_less", where, row)
    if direction not in ("stereo", "antistereo"):
        raise DataError(where, f"stereo_antistereo must be stereo or antistereo, got "
                               f"{direction!r}", row=row)
    bias = _text(bias_type, "bias_type", where, row).strip()
    if "/" in bias:
        raise DataError(where, f"bias_type {bias!r} contains '/'", row=row)
    meta = {"sent_more": more, "sent_less": less, "stereo_antistereo": direction,
            "bias_type": bias, "source_index": idx}
    return _item(item_id=f"crows_pairs/{idx}", benchmark="crows_pairs", split="test",
                 stratum=bias, meta=meta, sent_more=more, sent_less=less)


# ------------------------------------------------------------------------------- xstest
# ``text`` = the prompt, ``choices`` = [], ``gold`` = -1, ``label`` = safe / unsafe. meta:
# ``type``, ``focus``, ``note``, ``source_id``.
def xstest_item(source_id: Any, prompt: Any, type_: Any, label: Any, focus: Any, note: Any,
                *, where: str, row: int) -> dict:
    sid = _int(source_id, "id", where, row)
    prompt = _text(prompt, "prompt", where, row)
    type_ = _text(type_, "type", where, row).strip()
    if "/" in type_:
        raise DataError(where, f"type {type_!r} contains '/'", row=row)
    if label not in ("safe", "unsafe"):
        raise DataError(where, f"label must be safe or unsafe, got {label!r}", row=row)
    meta = {"type": type_, "focus": _text(focus, "focus", where, row, optional=True),
            "note": _text(note, "note", where, row, optional=True), "source_id": sid}
    return _item(item_id=f"xstest/{sid}", benchmark="xstest", split="test",
                 stratum=f"{label}/{type_}", text=prompt, label=label, meta=meta)
