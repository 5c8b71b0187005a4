"""What the engine's outputs are checked against in the tests."""

from __future__ import annotations

import contextlib

import torch

from safetyrepro.inference import encode_prompt

from numerics import Key, Sequence, reference_decisions


def reference_greedy(lm, prompt: str, max_new_tokens: int) -> Sequence:
    """What transformers' own greedy ``generate`` produces for ``prompt`` alone (batch size 1,
    no padding), stopping at the model's end-of-turn ids: the token ids (``.tokens``) and each
    step's decision with its top-2 margin (``.decisions``, for :func:`numerics.agree`)."""
    ids = torch.tensor([encode_prompt(lm.tokenizer, prompt)])
    out = lm.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                            max_new_tokens=max_new_tokens, eos_token_id=lm.stop_ids,
                            pad_token_id=lm.tokenizer.pad_token_id, output_scores=True,
                            return_dict_in_generate=True)
    tokens = out.sequences[0, ids.shape[1]:].tolist()
    return Sequence(Key(0.0, 1.0, None, prompt), reference_decisions(out.scores, tokens))


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
