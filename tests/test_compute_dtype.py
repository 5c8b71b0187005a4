"""runtime.cpu_compute_dtype: which dtype an NF4/bf16 model computes in on a CPU, what decides
``auto``, and that float32 compute runs the same weights (issue 29)."""

import copy

import pytest
import torch

from safetyrepro.config import load_config
from safetyrepro.errors import ConfigError
from safetyrepro.compute_dtype import compute_dtype, cpu_flags, native_bf16
from safetyrepro.models.packed_linear import resolve as resolve_linear
from safetyrepro.plan import Plan

AMX = frozenset({"avx512f", "avx512_bf16", "amx_bf16", "amx_tile"})
AVX512_ONLY = frozenset({"avx512f", "avx512bw", "avx512vl"})


def test_auto_follows_native_bf16_and_onednn_caps():
    assert compute_dtype("auto", "cpu", "nf4", AMX, {}) == "bfloat16"
    assert compute_dtype("auto", "cpu", "nf4", AVX512_ONLY, {}) == "float32"
    assert compute_dtype("auto", "cpu", "bf16", AVX512_ONLY, {}) == "float32"
    # oneDNN capped below its bf16 kernels emulates bf16 like a CPU without the instructions
    assert compute_dtype("auto", "cpu", "nf4", AMX, {"ONEDNN_MAX_CPU_ISA": "avx512_core"}) == "float32"
    assert compute_dtype("auto", "cpu", "nf4", AMX, {"DNNL_MAX_CPU_ISA": "AVX2"}) == "float32"
    assert compute_dtype("auto", "cpu", "nf4", AMX, {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX"}) == "bfloat16"
    # explicit settings, fp32 models and GPUs do not depend on the CPU
    assert compute_dtype("bf16", "cpu", "nf4", AVX512_ONLY, {}) == "bfloat16"
    assert compute_dtype("float32", "cpu", "nf4", AMX, {}) == "float32"
    assert compute_dtype("auto", "cpu", "fp32", AMX, {}) == "float32"
    assert compute_dtype("auto", "cuda", "nf4", AVX512_ONLY, {}) == "bfloat16"
    with pytest.raises(ValueError, match="cpu_compute_dtype 'fp16'"):
        compute_dtype("fp16", "cpu", "nf4", AMX, {})


def test_cpu_flags_read_x86_and_arm_cpuinfo(tmp_path):
    x86 = tmp_path / "x86"
    x86.write_text("processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu avx512f avx512_bf16\n\n"
                   "processor\t: 1\nflags\t\t: fpu\n")
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd bf16 i8mm\n")
    assert cpu_flags(str(x86)) == {"fpu", "avx512f", "avx512_bf16"}
    assert native_bf16(cpu_flags(str(arm)), {})
    assert cpu_flags(str(tmp_path / "missing")) == frozenset()
    assert not native_bf16(frozenset(), {})


def _cfg_with(default_cfg, tmp_path, **runtime):
    import yaml

    from config_support import config_copy

    raw = config_copy(default_cfg.path)
    raw.setdefault("runtime", {}).update(runtime)
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_config(path)


def test_setting_is_validated_at_load(default_cfg, tmp_path):
    with pytest.raises(ConfigError, match="cpu_compute_dtype"):
        _cfg_with(default_cfg, tmp_path, cpu_compute_dtype="fp16")


def test_fingerprint_and_worker_key_name_the_compute_dtype(default_cfg, tmp_path):
    plans = {s: Plan(_cfg_with(default_cfg, tmp_path / s, device="cpu", cpu_compute_dtype=s))
             for s in ("bf16", "float32")}
    fp = {s: p.cell_fingerprint("smollm2-135m", "truthfulqa", "T1-greedy-k0-freeform", 0, chat_template=False)
          for s, p in plans.items()}
    assert fp["bf16"] != fp["float32"]
    assert plans["bf16"].runtime.compute_dtype(plans["bf16"].quantization("smollm2-135m")) == "bfloat16"
    assert plans["float32"].runtime.compute_dtype(plans["float32"].quantization("smollm2-135m")) == "float32"
    assert plans["bf16"].worker_key("smollm2-135m", "nf4") != plans["float32"].worker_key("smollm2-135m", "nf4")
    # the fingerprint's field is the one a worker fills from the model it loaded
    from safetyrepro.fingerprints import cell_fingerprint, cell_fingerprint_fields

    p = plans["bf16"]
    c = p.config("T1-greedy-k0-freeform")
    common = dict(template_hash=p.fingerprints.template_hash("truthfulqa", "T1"), weights=None, code=p.fingerprints.inference_code)
    loaded = {d: cell_fingerprint(cell_fingerprint_fields(
        p.cfg, "smollm2-135m", "nf4", "truthfulqa", c, 0, p.decode_group("truthfulqa", "T1-greedy-k0-freeform"),
        compute=d, linear=resolve_linear("packed", "cpu", d), **common)) for d in ("bfloat16", "float32")}
    assert loaded["bfloat16"] == fp["bf16"] and loaded["float32"] != fp["bf16"]


@pytest.mark.slow
@pytest.mark.numerics
def test_float32_compute_runs_the_same_nf4_weights(default_cfg):
    """float32 compute holds exactly the dequantised NF4 weights the bf16 engine holds, and its
    logits differ from the bf16 engine's by no more than bf16 rounding of the same model."""
    from safetyrepro.inference import encode_prompt
    from safetyrepro.models import load_model

    lm16 = load_model(default_cfg, "smollm2-135m", quantization="nf4", device="cpu", cpu_compute_dtype="bf16")
    lm32 = load_model(default_cfg, "smollm2-135m", quantization="nf4", device="cpu", cpu_compute_dtype="float32")
    assert lm16.info["compute_dtype"] == "bfloat16" and lm32.info["compute_dtype"] == "float32"
    assert {p.dtype for p in lm32.model.parameters()} == {torch.float32}
    p16 = dict(lm16.model.named_parameters())
    for name, w in lm32.model.named_parameters():
        assert torch.equal(w, p16[name].float()), name
    ids = torch.tensor([encode_prompt(lm16.tokenizer, "Question: Is the sky blue? Answer:")])
    with torch.inference_mode():
        l16 = lm16.model(input_ids=ids).logits.float()
        l32 = lm32.model(input_ids=ids).logits
        ref = torch.nn.Module.to(lm16.model, torch.float64)(input_ids=ids).logits
    # the float32 model is the closer one to exact arithmetic on these weights
    err32 = (l32.double() - ref).abs().max().item()
    err16 = (l16.double() - ref).abs().max().item()
    assert err32 < err16 / 10, (err32, err16)
