"""The model-backend seam: what a cell asks of a model, and this engine's answer to it.

A cell needs two things from a model: decode its prompts under a decode group's streams, and
score candidate continuations. :class:`ModelBackend` is that interface; :class:`EngineBackend`
implements it with this package's engine on a loaded transformers model (and the model's
prefill store). Another backend (a server, another library) implements the same two methods
and the cells run unchanged; the tokenizer-free contract is strings in, :class:`.Generation`
and :class:`.CandidateScore` out, and what was decided about batches into a
:class:`.batching.BatchRecord`. A backend also names the tokenizer whose chat template renders
the prompts (None: the plain rendering) and counts a prompt's tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from .batching import BatchRecord
from .decode import Generation
from .generate import generate_streams
from .sampling import Stream
from .scoring import CandidateScore, score_candidates
from .store import PrefillStore


class ModelBackend(Protocol):
    info: dict
    tokenizer: object  # renders chat prompts (:func:`.models.format_prompt`); None: plain text

    def count_tokens(self, text: str) -> int:
        """The number of tokens ``text`` encodes to."""

    def generate_streams(self, prompts: list[str], streams: list[Stream], *, max_new_tokens: int,
                         batch_size: int, progress=None,
                         record: BatchRecord | None = None) -> list[list[Generation]]:
        """One list of generations (prompt order) per stream."""

    def score_candidates(self, contexts: list[str], candidates: list[list[str]], *,
                         batch_size: int, progress=None,
                         record: BatchRecord | None = None) -> list[list[CandidateScore]]:
        """``candidates[i][j]`` scored as a continuation of ``contexts[i]``."""


@dataclass
class EngineBackend:
    """This engine on ``lm`` (a loaded model), reusing prefills through ``store``."""
    lm: object
    store: PrefillStore | None = None

    @property
    def info(self) -> dict:
        return self.lm.info

    @property
    def tokenizer(self):
        return self.lm.tokenizer

    def count_tokens(self, text: str) -> int:
        return len(self.lm.tokenizer(text)["input_ids"])

    def generate_streams(self, prompts, streams, *, max_new_tokens, batch_size, progress=None,
                         record=None):
        return generate_streams(self.lm, prompts, streams, max_new_tokens=max_new_tokens,
                                batch_size=batch_size, progress=progress, store=self.store,
                                record=record)

    def score_candidates(self, contexts, candidates, *, batch_size, progress=None, record=None):
        return score_candidates(self.lm, contexts, candidates, batch_size=batch_size,
                                progress=progress, store=self.store, record=record)
