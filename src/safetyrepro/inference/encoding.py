"""Tokenisation rules shared by generation and scoring.

Prompts (:func:`encode_prompt`): the text is encoded without the tokenizer's automatic special
tokens; if the tokenizer normally prepends a BOS token (Gemma) and the text does not already
start with it (a chat template may render it), the BOS id is prepended. So a chat-templated
prompt never gets a doubled BOS and a base model still sees its BOS.

Context/continuation pairs (:func:`encode_pair`): the context and the continuation are encoded
SEPARATELY and concatenated, so every candidate of an item shares exactly the same context
tokens (which is what lets the scorer reuse one context KV cache for all candidates). Trailing
spaces and tabs of the context (not newlines) are first moved to the front of the
continuation: BPE / SentencePiece vocabularies attach a leading space to the following word
(``"Answer: A"`` -> ``"Answer" ":" " A"``), so ``("Answer: ", "A")`` is scored as
``("Answer:", " A")``, the tokens the model would produce itself. Newlines stay with the
context because chat templates end their generation prompt with one (``"<|im_start|>assistant\\n"``).
The continuation is encoded without special tokens. This is the lm-evaluation-harness idea
(whitespace moved to the continuation) with separate encoding instead of "encode the whole and
subtract the context", which can merge tokens across the boundary and then no longer shares
the context tokens between candidates.
"""

from __future__ import annotations

_TRAILING = " \t"


def _adds_bos(tokenizer) -> bool:
    cached = getattr(tokenizer, "_safetyrepro_adds_bos", None)
    if cached is not None:
        return cached
    bos = tokenizer.bos_token_id
    adds = False
    if bos is not None:
        with_special = tokenizer("a", add_special_tokens=True)["input_ids"]
        adds = bool(with_special) and with_special[0] == bos
    try:
        tokenizer._safetyrepro_adds_bos = adds
    except AttributeError:
        pass
    return adds


def encode_prompt(tokenizer, text: str) -> list[int]:
    """Token ids of a prompt string (see the module docstring for the BOS rule)."""
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    if _adds_bos(tokenizer) and (not ids or ids[0] != tokenizer.bos_token_id):
        ids.insert(0, tokenizer.bos_token_id)
    return ids


def split_trailing_space(context: str, continuation: str) -> tuple[str, str]:
    """Move the context's trailing spaces/tabs to the front of the continuation."""
    stripped = context.rstrip(_TRAILING)
    moved = context[len(stripped):]
    return stripped, moved + continuation


def encode_continuation(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def encode_pair(tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """``(context_ids, continuation_ids)`` under the rule of the module docstring."""
    ctx, cont = split_trailing_space(context, continuation)
    return encode_prompt(tokenizer, ctx), encode_continuation(tokenizer, cont)


def common_prefix_len(seqs: list[list[int]]) -> int:
    """Length of the longest token prefix shared by all of ``seqs``."""
    if not seqs:
        return 0
    first = seqs[0]
    n = min(len(s) for s in seqs)
    for s in seqs[1:]:
        i = 0
        while i < n and s[i] == first[i]:
            i += 1
        n = i
        if n == 0:
            break
    return n
