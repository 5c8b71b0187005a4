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

**Models without a system role.** A chat template "has a system role" when it renders a leading
system message inside its own markup, before the first user turn (Qwen2.5:
``<|im_start|>system ...``). Templates that instead raise on a system message, drop it, move it
elsewhere (Mistral-7B-Instruct-v0.3 puts it into the *last* user turn, as does Mistral's own
request rendering in ``mistral-common``) or print it raw before the first turn without any role
markup (Yi-1.5-Chat) get one rule, :func:`fold_system`: the system text is put at the start of
the FIRST user turn, followed by a blank line (``system + "\n\n" + user``), and the template
sees no system message. So the role text of T2 always comes first, before the few-shot
exemplars, inside the model's user markup, the same for every item (a shared prefix) and the
same for every model without a system role. :func:`system_role` decides by rendering probe
messages with the model's template (:data:`SYSTEM_RULE` names the rule in the template hash).

A template's own default system prompt is kept: Qwen2.5's template injects
``"You are Qwen, created by Alibaba Cloud. You are a helpful assistant."`` when no system
message is given (T1, T3, T4), and T2's role text replaces it. That is the model's documented
chat format, so it is part of the harness choice "the model's chat template", which
:func:`template_hash` identifies (recorded in every shard and in the cell fingerprint).
"""

from __future__ import annotations

from ..hashing import canonical_hash

PLAIN_USER = "User: "
PLAIN_ASSISTANT = "Assistant:"
PLAIN_STOP = "\nUser:"

# Chat end-of-turn markers of common templates; those present in a vocabulary stop generation.
END_OF_TURN_TOKENS = ("<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|endoftext|>")

_ROLES = ("system", "user", "assistant")

# The plain-text format's identity (bump when format_plain changes) and the no-system-role rule.
PLAIN_FORMAT_ID = "safetyrepro-plain-v1"
SYSTEM_RULE = "system-into-first-user-turn-v1"
SYSTEM_JOIN = "\n\n"

_PROBE = {"system": "SAFETYREPRO_PROBE_SYSTEM", "user1": "SAFETYREPRO_PROBE_USER_1",
          "assistant": "SAFETYREPRO_PROBE_ASSISTANT", "user2": "SAFETYREPRO_PROBE_USER_2"}


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def chat_template_text(tokenizer) -> str | None:
    """The tokenizer's chat template source (several named templates: their canonical JSON)."""
    t = getattr(tokenizer, "chat_template", None)
    if not t:
        return None
    if isinstance(t, dict):
        return canonical_hash(t)
    return str(t)


def _render(tokenizer, messages: list[dict], add_generation_prompt: bool) -> str:
    out = tokenizer.apply_chat_template(messages, tokenize=False,
                                        add_generation_prompt=add_generation_prompt)
    if not isinstance(out, str):
        raise TypeError(f"apply_chat_template returned {type(out).__name__}, not a string")
    return out


def system_role(tokenizer) -> bool:
    """Whether the tokenizer's chat template has a system role (module docstring): a leading
    system message is rendered, before the first user turn, and not as bare text in front of
    the conversation. Decided once per template by rendering probe messages."""
    text = chat_template_text(tokenizer)
    if text is None:
        return True  # the plain format places the system text itself
    cache = getattr(tokenizer, "_safetyrepro_system_role", None)
    if cache and cache[0] == text:
        return cache[1]
    p = _PROBE
    turns = [{"role": "user", "content": p["user1"]}, {"role": "assistant", "content": p["assistant"]},
             {"role": "user", "content": p["user2"]}]
    try:
        with_sys = _render(tokenizer, [{"role": "system", "content": p["system"]}] + turns, True)
        without = _render(tokenizer, turns, True)
    except Exception:  # the template refuses a system message (raise_exception) or the roles
        result = False
    else:
        at = with_sys.find(p["system"])
        raw = at != -1 and with_sys == without[:at] + p["system"] + without[at:]  # no markup
        result = at != -1 and at < with_sys.find(p["user1"]) and not raw
    try:
        tokenizer._safetyrepro_system_role = (text, result)
    except AttributeError:
        pass
    return result


def fold_system(tokenizer, messages: list[dict]) -> list[dict]:
    """``messages`` as the model's template receives them: unchanged when the template has a
    system role (or there is no system message); otherwise the system text is moved to the
    start of the first user turn, joined by a blank line (the rule of the module docstring)."""
    if not messages or messages[0].get("role") != "system" or system_role(tokenizer):
        return messages
    system, rest = messages[0]["content"], [dict(m) for m in messages[1:]]
    for m in rest:
        if m["role"] == "user":
            m["content"] = system + SYSTEM_JOIN + m["content"]
            return rest
    return rest  # no user turn to carry it (a shared part of only a system message)


def template_hash(tokenizer) -> str:
    """Identity of how prompts are rendered for this tokenizer: sha256 of the chat template's
    source and of the system-message rule applied to it, or of the plain format's id for a
    model without a template. A template is a harness choice: the hash is recorded in every
    shard and enters the cell fingerprint."""
    text = chat_template_text(tokenizer)
    if text is None:
        return canonical_hash({"plain_format": PLAIN_FORMAT_ID})
    return canonical_hash({"chat_template": text,
                           "system": "template" if system_role(tokenizer) else SYSTEM_RULE})


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
        return _render(tokenizer, fold_system(tokenizer, messages), True)
    return format_plain(messages)


def format_prompt_parts(tokenizer, shared: list[dict], item: list[dict]) -> tuple[str, str]:
    """Split ``format_prompt(tokenizer, shared + item)`` into ``(prefix, suffix)`` where
    ``prefix`` is the rendering of the shared turns (system text, few-shot exemplars) as far as
    it is a prefix of the full prompt (a template without a system role gets the shared turns
    after :func:`fold_system`, i.e. a lone system message renders nothing on its own); ``prefix + suffix`` always equals the full prompt.

    The inference engine finds shared token prefixes by itself (see
    :mod:`safetyrepro.inference.prefix`), so callers only need this to inspect or log the
    shared part."""
    full = format_prompt(tokenizer, shared + item)
    if not shared:
        return "", full
    if has_chat_template(tokenizer):
        folded = fold_system(tokenizer, shared)
        head = _render(tokenizer, folded, False) if folded else ""
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
