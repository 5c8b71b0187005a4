"""The prompt side of a task: its templates -> chat messages and logprob requests.

:class:`TaskPrompts` holds everything that shapes what a model is asked (templates, field
mapping, option and answer presentation, candidates) and the hash of it per template
(:meth:`TaskPrompts.template_hash`). It imports no parser: the scoring side is
:class:`.task.Task`, which adds parsing and scoring to it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import ConfigError
from ..hashing import canonical_hash
from ..provenance import group_fingerprint
from .render import (INSTRUCTIONS_JOINER, accepted_labels, choices_of, gold_index, item_error,
                     placeholders, render, text_value)

PATHS = ("freeform", "logprob")


def render_code_hash() -> str:
    """Fingerprint of the prompt-rendering code: the "render" group of
    :data:`safetyrepro.provenance.CODE_GROUPS` (this module and ``tasks/render.py``)."""
    return group_fingerprint("render")


@dataclass(frozen=True, eq=False)
class TaskPrompts:
    path: str
    content: dict = field(repr=False)

    # ------------------------------------------------------------------ description
    @property
    def benchmark(self) -> str:
        return self.content["benchmark"]

    @property
    def template_ids(self) -> list[str]:
        """Template ids in file order."""
        return list(self.content["templates"])

    @property
    def scoring_paths(self) -> list[str]:
        """Supported scoring paths ('freeform', 'logprob')."""
        return list(self.content["scoring_paths"])

    @property
    def answer_kind(self) -> str:
        return self.content["answer"]["kind"]

    def template_hash(self, template_id: str) -> str:
        """sha256 of everything that shapes this template's prompts and candidates: its own
        texts, the benchmark's field mapping and answer presentation (option format,
        letters, label displays, candidates), and the source of the rendering code
        (:func:`render_code_hash`). Other templates and the parser/scoring sections do not
        enter it."""
        return canonical_hash({
            "benchmark": self.benchmark,
            "template_id": template_id,
            "template": self._template(template_id),
            "fields": self.content["fields"],
            "answer": self.content["answer"],
            "render_code": render_code_hash(),
        })

    # ------------------------------------------------------------------ prompts
    def _template(self, template_id: str) -> dict:
        try:
            return self.content["templates"][template_id]
        except KeyError:
            raise ConfigError(self.path, "templates", f"unknown template {template_id!r}; "
                              f"this task declares: {', '.join(self.template_ids)}") from None

    def _block(self, template_id: str, path: str) -> dict:
        tpl = self._template(template_id)
        if path not in PATHS or path not in tpl:
            raise ConfigError(self.path, f"templates.{template_id}",
                              f"no {path!r} prompt: {self.benchmark} supports scoring paths "
                              f"{', '.join(self.scoring_paths)}")
        return tpl[path]

    def format_options(self, item: dict) -> str:
        a = self.content["answer"]
        choices = choices_of(self.benchmark, item)
        if len(choices) > len(a["letters"]):
            raise item_error(self.benchmark, item, f"{len(choices)} options but only "
                             f"{len(a['letters'])} letters ({a['letters']}) are declared")
        return a["option_separator"].join(
            render(a["option_format"], {"letter": a["letters"][i], "text": c}) for i, c in enumerate(choices))

    def _field_values(self, item: dict, names: set[str]) -> dict[str, str]:
        values = {}
        for name in names:
            source = self.content["fields"].get(name)
            if source is None:
                continue  # an answer field, filled by _answer_values
            if source == "options":
                values[name] = self.format_options(item)
            else:
                values[name] = text_value(self.benchmark, item, source, f"placeholder {{{name}}}")
        return values

    def _answer_values(self, item: dict) -> dict[str, str]:
        """Values an exemplar's answer turn may use: its gold label/letter and text."""
        a = self.content["answer"]
        if self.answer_kind == "choice":
            choices = choices_of(self.benchmark, item)
            gold = gold_index(self, item, len(choices))
            return {"label": a["letters"][gold], "answer_text": choices[gold], "candidate": choices[gold]}
        if self.answer_kind == "label":
            gold = accepted_labels(self, item)[0]
            spec = a["labels"][gold]
            values = {"label": spec["display"], "answer_text": spec["display"],
                      "candidate": spec.get("candidate", spec["display"]).strip()}
            if "rationale" in spec:
                values["rationale"] = spec["rationale"]
            return values
        less = text_value(self.benchmark, item, a["less"], "a few-shot exemplar's answer")
        return {"answer_text": less, "candidate": less}

    def _turn(self, block: dict, key: str, item: dict, extra: dict | None = None) -> str:
        text = block[key]
        values = self._field_values(item, placeholders(text))
        if extra:
            values.update(extra)
        return render(text, values)

    def build_messages(self, item: dict, template_id: str, fewshot: list[dict],
                       path: str = "freeform") -> list[dict]:
        """Chat messages for one item: an optional system message, each few-shot exemplar as
        a user turn and its gold answer as the assistant turn, then the item's user turn. The
        template's instructions (if any) open the first user turn. ``path`` picks the
        free-form or logprob variant of the template."""
        block = self._block(template_id, path)
        for ex in fewshot:
            if ex.get("item_id") is not None and ex.get("item_id") == item.get("item_id"):
                raise item_error(self.benchmark, item, "is also one of its own few-shot exemplars")
        messages = []
        if block.get("system"):
            messages.append({"role": "system", "content": block["system"]})
        turns = []
        for ex in fewshot:
            turns.append(["user", self._turn(block, "user", ex)])
            turns.append(["assistant", self._turn(block, "answer", ex, self._answer_values(ex))])
        turns.append(["user", self._turn(block, "user", item)])
        if block.get("instructions"):
            turns[0][1] = block["instructions"] + INSTRUCTIONS_JOINER + turns[0][1]
        messages.extend({"role": role, "content": content} for role, content in turns)
        return messages

    def candidates(self, item: dict) -> list[str]:
        """The candidate continuations the logprob path scores, in a fixed order (choice:
        the options; label: the declared labels; pair: [more, less])."""
        a = self.content["answer"]
        if self.answer_kind == "choice":
            return [a["candidate_prefix"] + c for c in choices_of(self.benchmark, item)]
        if self.answer_kind == "label":
            return [spec["candidate"] for spec in a["labels"].values()]
        return [a["candidate_prefix"] + text_value(self.benchmark, item, a[k], "the logprob candidates")
                for k in ("more", "less")]

    def candidate_labels(self, item: dict) -> list[str]:
        """The label each candidate stands for (letters, declared labels, or more/less)."""
        if self.answer_kind == "choice":
            return list(self.content["answer"]["letters"][: len(choices_of(self.benchmark, item))])
        if self.answer_kind == "label":
            return list(self.content["answer"]["labels"])
        return ["more", "less"]

    def logprob_request(self, item: dict, template_id: str, fewshot: list[dict]) -> tuple[list[dict], list[str]]:
        """(messages, candidates): the engine renders ``messages`` with the chat template and
        generation prompt as the context and scores each candidate as its continuation."""
        if "logprob" not in self.scoring_paths:
            raise ConfigError(self.path, "scoring_paths", f"{self.benchmark} has no logprob path")
        return self.build_messages(item, template_id, fewshot, path="logprob"), self.candidates(item)
