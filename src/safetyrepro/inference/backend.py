"""The model-backend seam: what a cell asks of a model, and this engine's answer to it.

A cell needs two things from a model: decode its prompts under a decode group's streams, and
score candidate continuations. :class:`ModelBackend` is that interface; :class:`EngineBackend`
implements it with this package's engine on a loaded transformers model (and the model's
prefill store). Another backend (a server, another library) implements the same two methods
and the cells run unchanged; the tokenizer-free contract is strings in, :class:`.Generation`
and :class:`.CandidateScore` out, and what was decided about batches into a
:class:`.batching.BatchRecord`. A backend also names the tokenizer whose chat template renders
the prompts (None: the plain rendering) and counts a prompt's tokens.

:class:`FakeBackend` answers without a model: deterministic outputs derived from hashes of
the prompt and the stream, so cells, decode groups, aggregation and the workflow rules run on
it in milliseconds; its ``info`` says it is fake.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
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


# What the fake model says: short words, answer letters and yes/no, so parsers see both
# answers they accept and answers they refuse.
FAKE_WORDS = ("A", "B", "C", "yes", "no", "Sure", "I", "cannot", "help", "the", "answer", "is",
              "unknown", "true", "false", ".")


def _digest(*parts) -> bytes:
    return hashlib.sha256("\x1f".join(map(str, parts)).encode("utf-8")).digest()


@dataclass
class FakeBackend:
    """A deterministic stand-in for a model, without tokenizer or weights: a generation is a
    few words picked by the hash of (model key, quantization, prompt, stream temperature, top_p,
    seed); a candidate's log-likelihood a number from the hash of (model key, quantization,
    context, candidate), so two fake models answer differently. Tokens are whitespace words.
    ``model_key`` / ``quantization`` / ``weights_hash``: what its ``info`` names (a cell checks
    the model it asked for, and the weights its fingerprint names)."""
    model_key: str
    quantization: str = "fp32"
    weights_hash: str | None = None
    tokenizer: object = field(default=None, init=False)

    @property
    def info(self) -> dict:
        return {"backend": "fake", "model_key": self.model_key, "quantization": self.quantization,
                "weights_hash": self.weights_hash, "device": "cpu", "dtype": "none",
                "chat_template_hash": None}

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def generate_streams(self, prompts, streams, *, max_new_tokens, batch_size, progress=None,
                         record=None):
        out = []
        for st in streams:
            gens = []
            for prompt in prompts:
                h = _digest(self.model_key, self.quantization, prompt, st.temperature, st.top_p, st.seed)
                n = 1 + h[0] % max(1, max_new_tokens)
                words = [FAKE_WORDS[b % len(FAKE_WORDS)] for b in h[1:1 + n]]
                gens.append(Generation(" ".join(words), self.count_tokens(prompt), len(words),
                                       "length" if n == max_new_tokens else "eos", 0.0))
            out.append(gens)
        return out

    def score_candidates(self, contexts, candidates, *, batch_size, progress=None, record=None):
        out = []
        for ctx, cands in zip(contexts, candidates):
            row = []
            for cand in cands:
                h = _digest(self.model_key, self.quantization, ctx, cand)
                row.append(CandidateScore(-int.from_bytes(h[:4], "big") / 2**28,
                                          max(1, self.count_tokens(cand)), False))
            best = max(range(len(row)), key=lambda j: row[j].loglik) if row else None
            out.append([CandidateScore(s.loglik, s.n_tokens, j == best) for j, s in enumerate(row)])
        return out
