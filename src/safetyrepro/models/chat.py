"""Chat formatting: messages -> the prompt string a model sees, and where a turn ends.

A model whose tokenizer has a chat template gets its own template
(``apply_chat_template(messages, tokenize=False, add_generation_prompt=True)``).

A base model without one (Gemma-3-270m base) gets the documented plain-text format
plain-text format::

    <system text>                      (only when a system message is given)
                                       (blank line)
    User: <user turn 1>
    Assistant: <assistant turn 1>
                                       (blank line between exchanges)
    User: <user turn 2>
    Assistant:

i.e. the system text followed by a blank line, each user turn as ``"User: " + text + "\\n"``,
each completed assistant turn as ``"Assistant: " + text + "\\n\\n"``, and the prompt ends with
``"Assistant:"`` (no trailing space: the answer's first token carries its leading space).
Generation in this format stops at the next ``"\\nUser:"`` (:func:`stop_strings_for`), the
plain format's end of turn. Few-shot exemplars are prior user/assistant turns built by the
caller.
"""

from __future__ import annotations

PLAIN_USER = "User: "
PLAIN_ASSISTANT = "Assistant:"
PLAIN_STOP = "\nUser:"

# Chat end-of-turn markers of common templates; those present in a vocabulary stop generation.
END_OF_TURN_TOKENS = ("<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|endoftext|>")

_ROLES = ("system", "user", "assistant")


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def _check(messages: list[dict]) -> None:
    if not messages:
        raise ValueError("format_prompt: no messages")
    for i, m in enumerate(messages):
        role = m.get("role")
        if role not in _ROLES:
            raise ValueError(f"format_prompt: message {i} has role {role!r}; expected {_ROLES}")
        if not isinstance(m.get("content"), str):
            raise ValueError(f"format_prompt: message {i} content must be a string")
        if role == "system" and i != 0:
            raise ValueError(f"format_prompt: system message at position {i}; only the first "
                             "message may be a system message")
    if messages[-1]["role"] != "user":
        raise ValueError("format_prompt: the last message must be a user turn")


def format_plain(messages: list[dict], *, add_generation_prompt: bool = True) -> str:
    """Render ``messages`` in the plain-text format (see the module docstring)."""
    out = []
    for m in messages:
        if m["role"] == "system":
            out.append(m["content"] + "\n\n")
        elif m["role"] == "user":
            out.append(PLAIN_USER + m["content"] + "\n")
        else:
            out.append(PLAIN_ASSISTANT + " " + m["content"] + "\n\n")
    if add_generation_prompt:
        out.append(PLAIN_ASSISTANT)
    return "".join(out)


def format_prompt(tokenizer, messages: list[dict]) -> str:
    """The prompt string for ``messages`` (list of ``{"role", "content"}``, roles system /
    user / assistant, system only first, last one a user turn)."""
    _check(messages)
    if has_chat_template(tokenizer):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return format_plain(messages)


def format_prompt_parts(tokenizer, shared: list[dict], item: list[dict]) -> tuple[str, str]:
    """Split ``format_prompt(tokenizer, shared + item)`` into ``(prefix, suffix)`` where
    ``prefix`` is the rendering of the shared turns (system text, few-shot exemplars) as far as
    it is a prefix of the full prompt; ``prefix + suffix`` always equals the full prompt.

    The inference engine finds shared token prefixes by itself (see
    :mod:`safetyrepro.inference.prefix`), so callers only need this to inspect or log the
    shared part."""
    full = format_prompt(tokenizer, shared + item)
    if not shared:
        return "", full
    if has_chat_template(tokenizer):
        head = tokenizer.apply_chat_template(shared, tokenize=False, add_generation_prompt=False)
    else:
        head = format_plain(shared, add_generation_prompt=False)
    n = 0
    for a, b in zip(head, full):
        if a != b:
            break
        n += 1
    return full[:n], full[n:]


def stop_token_ids(tokenizer, generation_config=None) -> list[int]:
    """Token ids that end a turn: the tokenizer's eos, the generation config's eos ids, and
    the end-of-turn markers of :data:`END_OF_TURN_TOKENS` present as single special tokens."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen_eos = getattr(generation_config, "eos_token_id", None) if generation_config else None
    if isinstance(gen_eos, int):
        ids.add(gen_eos)
    elif gen_eos:
        ids.update(int(i) for i in gen_eos)
    vocab = tokenizer.get_vocab()
    special = set(getattr(tokenizer, "all_special_tokens", []) or [])
    for tok in END_OF_TURN_TOKENS:
        if tok in vocab and (tok in special or tok in getattr(tokenizer, "added_tokens_encoder", {})):
            ids.add(int(vocab[tok]))
    return sorted(ids)


def stop_strings_for(tokenizer) -> list[str]:
    """Text markers ending a turn: the plain format's next ``"\\nUser:"`` for models without a
    chat template, none for chat models (their end-of-turn is a token)."""
    return [] if has_chat_template(tokenizer) else [PLAIN_STOP]
