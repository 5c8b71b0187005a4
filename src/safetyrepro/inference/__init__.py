"""Inference engine: batched generation (greedy / seeded sampling, several streams per
prefill) and candidate log-likelihood scoring with context KV-cache reuse.

One module per concept: :mod:`.backend` (the seam the cells call), :mod:`.generate` (the
generation API), :mod:`.decode` (decode loops), :mod:`.sampling` (next-token choice),
:mod:`.prefill` (forward passes, shared prefix, packed prefill), :mod:`.cache` (cache layers),
:mod:`.store` (prefills kept across calls), :mod:`.memory` (batches sized by memory),
:mod:`.batching` (batch order, out-of-memory splits, progress), :mod:`.scoring`,
:mod:`.packing`, :mod:`.attention`, :mod:`.encoding`."""

from .backend import EngineBackend, ModelBackend
from .encoding import encode_pair, encode_prompt
from .generate import Generation, Stream, generate, generate_multi_seed, generate_streams
from .scoring import CandidateScore, check_finite, score_candidates, score_candidates_plain

__all__ = ["EngineBackend", "ModelBackend", "Generation", "Stream", "generate",
           "generate_multi_seed", "generate_streams", "CandidateScore", "score_candidates",
           "score_candidates_plain", "check_finite", "encode_prompt", "encode_pair"]
