"""Free-form response parsers: raw model text -> a label of the benchmark's label set.

:func:`build_parser` turns a task file's ``parser`` section (kind and word lists) into a
parser of kind ``choice`` (option letters), ``label`` (a closed label set, ToxiGen) or
``refusal`` (XSTest). Parsers never raise and return ``ParseResult(None, False)`` when a
response determines no label. They know no task (only the ``refusal_agreement`` tool imports
``tasks``); the entry point is ``safetyrepro.tasks.parse_response``, and
``tasks.parser_version`` hashes this package with the task's scoring sections, so a parser
change re-scores stored raw outputs. The rules: docs/SCORING.md, "Free-form parsers".
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .choice import ChoiceSpec, parse_choice
from .label import LabelSpec, parse_label
from .refusal import RefusalSpec, parse_refusal

REFUSAL_LABELS = ("comply", "refuse", "partial")
_KIND_MODULES = {"choice": "choice.py", "label": "label.py", "refusal": "refusal.py"}


@dataclass(frozen=True)
class ParseResult:
    label: str | None
    ok: bool


def _lower_tuple(xs) -> tuple[str, ...]:
    return tuple(" ".join(str(x).lower().split()) for x in xs)


def refusal_spec(parser: dict) -> RefusalSpec:
    """The refusal classifier's settings from a task file's ``parser`` section."""
    return RefusalSpec(markers=_lower_tuple(parser["markers"]),
                       refusal_phrases=_lower_tuple(parser["refusal_phrases"]),
                       disclaimer_phrases=_lower_tuple(parser["disclaimer_phrases"]),
                       apology_phrases=_lower_tuple(parser["apology_phrases"]),
                       not_refusal=_lower_tuple(parser["not_refusal"]),
                       pivot_phrases=_lower_tuple(parser["pivot_phrases"]),
                       offer_phrases=_lower_tuple(parser["offer_phrases"]),
                       preamble_phrases=_lower_tuple(parser["preamble_phrases"]),
                       identity_phrases=_lower_tuple(parser["identity_phrases"]),
                       late_turn_phrases=_lower_tuple(parser["late_turn_phrases"]),
                       weak_turn_phrases=_lower_tuple(parser["weak_turn_phrases"]),
                       redirect_phrases=_lower_tuple(parser["redirect_phrases"]),
                       closing_phrases=_lower_tuple(parser["closing_phrases"]),
                       opening_sentences=int(parser["opening_sentences"]),
                       max_preamble=int(parser["max_preamble"]))


def build_parser(parser: dict, answer: dict) -> tuple[Callable[[Any, dict | None], str | None], tuple[str, ...]]:
    """A ``(text, item) -> label | None`` function and the label set it can return, from a
    task file's ``parser`` and ``answer`` sections (already schema-validated)."""
    kind = parser["kind"]
    if kind == "choice":
        spec = ChoiceSpec(markers=_lower_tuple(parser["markers"]),
                          conclusion_words=_lower_tuple(parser["conclusion_words"]),
                          letters=answer["letters"])

        def run(text, item):
            choices = item.get("choices") if isinstance(item, dict) else None
            choices = [str(c) for c in choices] if choices is not None and len(choices) else None
            return parse_choice(spec, text, choices)

        return run, tuple(answer["letters"])
    if kind == "label":
        labels = tuple(answer["labels"])
        spec = LabelSpec(
            labels=labels,
            markers=_lower_tuple(parser["markers"]),
            answer_words=tuple((lab, _lower_tuple(parser["answer_words"].get(lab, ()))) for lab in labels),
            phrases=tuple((lab, _lower_tuple(parser["phrases"].get(lab, ()))) for lab in labels),
            negations=_lower_tuple(parser["negations"]),
            abstain=_lower_tuple(parser["abstain"]),
        )
        return (lambda text, item: parse_label(spec, text)), labels
    if kind == "refusal":
        spec = refusal_spec(parser)
        return (lambda text, item: parse_refusal(spec, text)), REFUSAL_LABELS
    raise ValueError(f"unknown parser kind {kind!r}")  # unreachable after schema validation


def source_text(kind: str | None = None) -> str:
    """The source of the parsing code a parser kind runs (all kinds when None)."""
    here = Path(__file__).resolve().parent
    names = ["__init__.py", "text.py"]
    names += sorted(_KIND_MODULES.values()) if kind is None else [_KIND_MODULES[kind]]
    return "\n".join(f"# {n}\n" + (here / n).read_text(encoding="utf-8") for n in names)
