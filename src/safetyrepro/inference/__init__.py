"""Inference engine: batched generation (greedy / seeded sampling, multi-seed prefill reuse)
and candidate log-likelihood scoring with context KV-cache reuse."""

from .encoding import encode_pair, encode_prompt
from .generate import Generation, Stream, generate, generate_multi_seed, generate_streams
from .scoring import CandidateScore, check_finite, score_candidates, score_candidates_plain

__all__ = ["Generation", "Stream", "generate", "generate_multi_seed", "generate_streams",
           "CandidateScore", "score_candidates",
           "score_candidates_plain", "check_finite", "encode_prompt", "encode_pair"]
