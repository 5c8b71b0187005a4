"""Loading task files: schema validation plus the checks a JSON schema cannot express."""

from __future__ import annotations

import functools
from pathlib import Path

from ..errors import ConfigError
from ..parsing import REFUSAL_LABELS
from ..paths import TASKS_DIR
from ..schema import load_yaml, validate
from .render import placeholders
from .task import Task

# Placeholders an exemplar's answer may use besides the benchmark's fields, per answer kind.
ANSWER_FIELDS = {
    "choice": {"label", "answer_text", "candidate"},
    "label": {"label", "answer_text", "candidate"},
    "pair": {"answer_text", "candidate"},
}
# Which parser kinds fit which answer kinds.
PARSER_FOR_ANSWER = {"choice": {"choice"}, "label": {"label", "refusal"}, "pair": set()}
RULE_FOR_ANSWER = {"choice": "accuracy", "label": "accuracy", "pair": "pair_preference"}


def known_benchmarks() -> list[str]:
    """Benchmarks that have a task file."""
    return sorted(p.stem for p in TASKS_DIR.glob("*.yaml"))


@functools.lru_cache(maxsize=None)
def load_task(benchmark: str) -> Task:
    """The task of a benchmark (cached)."""
    known = known_benchmarks()
    if benchmark not in known:
        raise ConfigError(TASKS_DIR / f"{benchmark}.yaml", None,
                          f"unknown benchmark {benchmark!r}; known: {', '.join(known)}")
    path = TASKS_DIR / f"{benchmark}.yaml"
    task = load_task_file(path)
    if task.benchmark != benchmark:
        raise ConfigError(path, "benchmark", f"is {task.benchmark!r} but the file is named for {benchmark!r}")
    return task


def score_is_item_mean(benchmark: str) -> bool:
    """Whether the benchmark's cell score is the mean of its items' ``correct`` (every rule
    except CrowS-Pairs under the ``parity_distance`` convention). Unknown benchmarks (external
    tables) are taken as item means."""
    if benchmark not in known_benchmarks():
        return True
    return load_task(benchmark).content["scoring"].get("convention") != "parity_distance"


def load_task_file(path: str | Path) -> Task:
    """Load and fully validate one task file (not cached)."""
    path = Path(path)
    content = load_yaml(path)
    validate(content, "task", path)
    _check(content, path)
    return Task(path=str(path), content=content)


def _check_placeholders(path: Path, where: str, text: str | None, allowed: set[str], what: str) -> None:
    if text is None:
        return
    try:
        used = placeholders(text)
    except ValueError as exc:
        raise ConfigError(path, where, str(exc)) from exc
    unknown = sorted(used - allowed)
    if unknown:
        offer = ", ".join("{" + a + "}" for a in sorted(allowed)) or "no placeholders"
        raise ConfigError(path, where, f"uses unknown placeholder(s) "
                          f"{', '.join('{' + u + '}' for u in unknown)}; {what} may use: {offer}")


def _check(c: dict, path: Path) -> None:
    answer, kind = c["answer"], c["answer"]["kind"]
    paths = c["scoring_paths"]
    fields = set(c["fields"])

    if kind != "choice" and "options" in c["fields"].values():
        raise ConfigError(path, "fields", "source 'options' is only available when answer.kind is 'choice'")
    if kind == "choice":
        _check_placeholders(path, "answer.option_format", answer["option_format"], {"letter", "text"},
                            "the option format")

    # parser <-> answer kind <-> scoring paths
    if "freeform" in paths:
        if "parser" not in c:
            raise ConfigError(path, "parser", "required when scoring_paths includes 'freeform'")
        if c["parser"]["kind"] not in PARSER_FOR_ANSWER[kind]:
            raise ConfigError(path, "parser.kind", f"{c['parser']['kind']!r} does not fit answer.kind {kind!r}"
                              f" (allowed: {sorted(PARSER_FOR_ANSWER[kind]) or 'none: no free-form path'})")
    elif "parser" in c:
        raise ConfigError(path, "parser", "given but scoring_paths has no 'freeform'")
    if c["scoring"]["rule"] != RULE_FOR_ANSWER[kind]:
        raise ConfigError(path, "scoring.rule", f"answer.kind {kind!r} is scored by "
                          f"{RULE_FOR_ANSWER[kind]!r}, not {c['scoring']['rule']!r}")
    if c["scoring"]["rule"] == "pair_preference" and "convention" not in c["scoring"]:
        raise ConfigError(path, "scoring.convention", "required for pair_preference: anti_stereotype_share "
                          "(1 - pct_stereotype) or parity_distance (1 - 2|pct_stereotype - 0.5|)")
    if c["scoring"]["rule"] != "pair_preference" and "convention" in c["scoring"]:
        raise ConfigError(path, "scoring.convention", "only pair_preference has a convention")

    # label sets
    answer_fields = set(ANSWER_FIELDS[kind])
    if kind == "label":
        labels = set(answer["labels"])
        parsed = set(labels)
        if "parser" in c and c["parser"]["kind"] == "refusal":
            parsed = set(REFUSAL_LABELS)
            if not labels <= parsed:
                raise ConfigError(path, "answer.labels", f"a refusal parser yields {sorted(parsed)}; "
                                  f"labels {sorted(labels - parsed)} cannot be produced")
        for item_label, accepted in answer["gold_map"].items():
            bad = sorted(set(accepted) - parsed)
            if bad:
                raise ConfigError(path, f"answer.gold_map.{item_label}", f"unknown label(s) {bad}; known: {sorted(parsed)}")
            if accepted[0] not in labels:
                raise ConfigError(path, f"answer.gold_map.{item_label}", f"first label {accepted[0]!r} "
                                  "(the exemplar's answer) must be one of answer.labels")
        if "logprob" in paths:
            missing = sorted(lab for lab, spec in answer["labels"].items() if "candidate" not in spec)
            if missing:
                raise ConfigError(path, "answer.labels", f"labels {missing} need a 'candidate' for the logprob path")
        if all("rationale" in spec for spec in answer["labels"].values()):
            answer_fields.add("rationale")
        if c.get("parser", {}).get("kind") == "label":
            for section in ("answer_words", "phrases"):
                bad = sorted(set(c["parser"][section]) - labels)
                if bad:
                    raise ConfigError(path, f"parser.{section}", f"unknown label(s) {bad}; known: {sorted(labels)}")
        for i, rate in enumerate(c["scoring"].get("rates", [])):
            if rate["item_label"] not in answer["gold_map"]:
                raise ConfigError(path, f"scoring.rates.{i}.item_label",
                                  f"{rate['item_label']!r} is not a key of answer.gold_map")
            bad = sorted(set(rate["parsed"]) - parsed)
            if bad:
                raise ConfigError(path, f"scoring.rates.{i}.parsed", f"unknown label(s) {bad}; known: {sorted(parsed)}")
    elif c["scoring"].get("rates"):
        raise ConfigError(path, "scoring.rates", "rates need answer.kind 'label'")

    # templates: one block per scoring path, placeholders within what the benchmark provides
    for tid, tpl in c["templates"].items():
        for p in ("freeform", "logprob"):
            where = f"templates.{tid}.{p}"
            if p in paths and p not in tpl:
                raise ConfigError(path, where, f"missing: scoring_paths includes '{p}'")
            if p not in paths and p in tpl:
                raise ConfigError(path, where, f"given but scoring_paths has no '{p}'")
            if p not in tpl:
                continue
            block = tpl[p]
            for key in ("system", "instructions"):
                _check_placeholders(path, f"{where}.{key}", block.get(key), set(),
                                    f"'{key}' is shown once, independent of the item, and")
            _check_placeholders(path, f"{where}.user", block["user"], fields,
                                f"template {tid} (fields of benchmark {c['benchmark']})")
            _check_placeholders(path, f"{where}.answer", block["answer"], fields | answer_fields,
                                f"template {tid}'s exemplar answer")
