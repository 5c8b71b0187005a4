"""What the engine's outputs are checked against in the tests."""

from __future__ import annotations

import contextlib

import torch

from safetyrepro.inference import encode_prompt


def reference_greedy(lm, prompt: str, max_new_tokens: int) -> list[int]:
    """Token ids transformers' own greedy ``generate`` produces for ``prompt`` alone (batch
    size 1, no padding), stopping at the model's end-of-turn ids."""
    ids = torch.tensor([encode_prompt(lm.tokenizer, prompt)])
    out = lm.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                            max_new_tokens=max_new_tokens, eos_token_id=lm.stop_ids,
                            pad_token_id=lm.tokenizer.pad_token_id)
    return out[0, ids.shape[1]:].tolist()


@contextlib.contextmanager
def fed_shapes(lm):
    """Records the ``input_ids`` shape of every forward pass of ``lm`` inside the context."""
    shapes = []
    hook = lm.model.register_forward_pre_hook(
        lambda mod, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True)
    try:
        yield shapes
    finally:
        hook.remove()
