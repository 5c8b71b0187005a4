"""Throughput measurement of the engine on a loaded model (a planning aid; runs do not use it).

Prefill: ``batch_size`` synthetic prompts of ``prompt_tokens`` tokens (prefix caching off);
decode: the same batch generating exactly ``new_tokens`` tokens; scoring: ``batch_size`` items
of 4 short candidates through the KV-reuse scorer."""

from __future__ import annotations

import dataclasses
import time

import torch

from .capabilities import Capabilities
from .decode import decode_rows
from .encoding import encode_prompt
from .generate import generate
from .prefill import Prefix, prefill
from .sampling import _Sampler
from .scoring import score_candidates


def _prompts(tok, n: int, length: int) -> list[str]:
    out = []
    for i in range(n):
        words = " ".join(f"item{i} word{(i * 31 + j * 7) % 113}" for j in range(length))
        ids = tok(words, add_special_tokens=False)["input_ids"][:length]
        out.append(tok.decode(ids))
    return out


def measure_speed(lm, *, batch_size: int = 16, prompt_tokens: int = 256,
                  new_tokens: int = 32, repeats: int = 2) -> dict:
    """``{prefill_tok_s, decode_tok_s, decode_step_ms, score_items_s, ...}`` measured on
    ``lm`` (best of ``repeats`` after a warm-up)."""
    prompts = _prompts(lm.tokenizer, batch_size, prompt_tokens)
    enc = [encode_prompt(lm.tokenizer, p) for p in prompts]
    free = dataclasses.replace(lm, stop_ids=[], stop_strings=[])
    generate(free, prompts[:2], max_new_tokens=2, temperature=0, batch_size=2)  # warm-up
    t_pre, t_dec = [], []
    with torch.inference_mode():
        for _ in range(repeats):
            t0 = time.perf_counter()
            cache, mask, logits = prefill(free, Prefix([], None), enc, Capabilities.of(free))
            t1 = time.perf_counter()
            decode_rows(free, cache, mask, logits, _Sampler(0.0, 1.0, 0, prompts),
                    max_new_tokens=new_tokens, n_prompt=[len(e) for e in enc], t0=t1)
            t2 = time.perf_counter()
            t_pre.append(t1 - t0)
            t_dec.append(t2 - t1)
    ctx = [p + "\nAnswer:" for p in prompts]
    cands = [[" yes", " no", " maybe so", " I do not know"]] * len(ctx)
    t0 = time.perf_counter()
    score_candidates(lm, ctx, cands, batch_size=batch_size, prefix_cache=False)
    t_score = time.perf_counter() - t0
    n_prompt = sum(len(e) for e in enc)
    steps = new_tokens - 1  # the first new token comes from the prefill logits
    return {
        "model_key": lm.info["model_key"], "quantization": lm.info["quantization"],
        "device": lm.info["device"], "threads": torch.get_num_threads(),
        "batch_size": batch_size, "prompt_tokens": prompt_tokens, "new_tokens": new_tokens,
        "prefill_tok_s": round(n_prompt / min(t_pre), 1),
        "decode_tok_s": round(batch_size * steps / min(t_dec), 1),
        "decode_step_ms": round(1000 * min(t_dec) / steps, 1),
        "score_items_s": round(len(ctx) / t_score, 2),
    }
