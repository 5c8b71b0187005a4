"""A benchmark task: the prompt side (:mod:`.prompts`) plus parsing and scoring.

Built from a validated task file by :func:`safetyrepro.tasks.loader.load_task_file`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError
from ..hashing import canonical_hash
from ..parsing import ParseResult, build_parser, source_text
from . import render, scoring
from .prompts import PATHS, TaskPrompts, render_code_hash  # noqa: F401  (re-exported)
from .scoring import ItemResult


@dataclass(frozen=True, eq=False)
class Task(TaskPrompts):
    """A benchmark task: its prompt side (:class:`.prompts.TaskPrompts`) and its scoring side
    (parsing free-form responses, scoring both paths, summarising a cell)."""

    @property
    def labels(self) -> list[str]:
        """The labels a free-form response can be parsed into (empty without a parser)."""
        return list(self._parser[1]) if self._parser else []

    @functools.cached_property
    def parser_version(self) -> str:
        """Content hash of the code and task-file sections that turn raw outputs (free-form
        text, candidate log-likelihoods) into scored results."""
        parser = self.content.get("parser")
        return canonical_hash({
            "benchmark": self.benchmark,
            "parser": parser,
            "answer": self.content["answer"],
            "scoring": self.content["scoring"],
            "parsing_source": source_text(parser["kind"] if parser else None),
            "scoring_source": Path(scoring.__file__).read_text(encoding="utf-8"),
            "gold_source": Path(render.__file__).read_text(encoding="utf-8"),  # gold lookups
        })

    # ------------------------------------------------------------------ parsing/scoring
    @functools.cached_property
    def _parser(self):
        parser = self.content.get("parser")
        return build_parser(parser, self.content["answer"]) if parser else None

    def parse(self, text: object, item: dict | None = None) -> ParseResult:
        """Parse a free-form response; never raises on any ``text``."""
        if self._parser is None:
            raise ConfigError(self.path, "parser", f"{self.benchmark} has no free-form parser "
                              f"(scoring paths: {', '.join(self.scoring_paths)})")
        run, labels = self._parser
        label = run(text, item)
        return ParseResult(label, True) if label in labels else ParseResult(None, False)

    def score_freeform(self, item: dict, text: str) -> ItemResult:
        """The one place a free-form output becomes a label and a correct flag."""
        return scoring.score_freeform(self, item, text, self.parse)

    def score_logprob(self, item: dict, logliks: list[float], n_tokens: list[int]) -> ItemResult:
        return scoring.score_logprob(self, item, logliks, n_tokens)

    def summarize(self, results: list, items: list[dict]) -> dict:
        return scoring.summarize(self, results, items)
