"""Tokenisation rules shared by generation and scoring.

:func:`encode_prompt` encodes without automatic special tokens and prepends BOS only where the
tokenizer normally does and the text lacks it, so a chat-templated prompt never gets two.
:func:`encode_pair` encodes context and continuation separately (every candidate of an item
then shares the same context tokens, which the scorer's cache reuse needs), after moving the
context's trailing spaces/tabs to the continuation, where BPE/SentencePiece vocabularies attach
them; newlines stay with the context, as chat templates end the generation prompt with one.
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
