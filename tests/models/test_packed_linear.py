"""runtime.cpu_linear: bf16 linear layers on weights packed once for oneDNN (issue 29).

The packed path runs the same weights in bf16 with float32 sums, in another order than
F.linear for some row counts: held to tests/numerics.py's bf16 rule against the plain path,
on single layers and on a real embedded model, and named in fingerprints and worker keys."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from safetyrepro.errors import ConfigError
from safetyrepro.compute_dtype import native_bf16
from safetyrepro.models.packed_linear import PackedForward, available, pack_linears, packed_bytes, resolve
from safetyrepro.plan import Plan

from numerics import bf16_tolerance, matmul_bound
from test_compute_dtype import _cfg_with


# what packing resolves to on this machine (native bf16, no oneDNN cap below it)
HERE = resolve("packed", "cpu", "bfloat16")


def test_resolve_packs_only_native_bf16_on_a_cpu():
    assert resolve("packed", "cpu", "bfloat16", native=True) == "packed"
    assert resolve("packed", "cpu", "bfloat16", native=False) == "plain"  # bf16 forced, emulated
    assert resolve("packed", "cpu", "float32", native=True) == "plain"
    assert resolve("packed", "cuda", "bfloat16", native=True) == "plain"
    assert resolve("plain", "cpu", "bfloat16", native=True) == "plain"
    assert HERE == ("packed" if native_bf16() else "plain")
    # where it resolves to packed, oneDNN packs bf16 weights here
    assert available() or HERE == "plain"
    with pytest.raises(ValueError, match="cpu_linear 'fast'"):
        resolve("fast", "cpu", "bfloat16")


def test_setting_is_validated_at_load(default_cfg, tmp_path):
    with pytest.raises(ConfigError, match="cpu_linear"):
        _cfg_with(default_cfg, tmp_path, cpu_linear="fast")


def _layers():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(96, 200), torch.nn.Linear(200, 64, bias=False),
                              torch.nn.Linear(64, 32))
    net[0].to(torch.bfloat16)
    net[1].to(torch.bfloat16)  # the third stays float32: not packed
    return net


@pytest.mark.parametrize("rows", [1, 7, 64, 300])
def test_packed_layer_is_f_linear_up_to_bf16_sums(rows):
    """Each packed layer's output lies within the float32-sum bound of the exact product of
    the same bf16 inputs and weights, as F.linear's does; bias included; 3-D and non-contiguous
    inputs take the same path. Where oneDNN cannot pack bf16 weights (no AVX-512 BW/VL/DQ or
    AVX-NE-CONVERT, or capped below them) the engine must not try: it resolves to plain."""
    if not available():
        assert HERE == "plain"
        return
    net = _layers()
    plain = {i: (net[i].weight.detach().clone(), None if net[i].bias is None else net[i].bias.detach().clone())
             for i in (0, 1)}
    assert pack_linears(net) == 2
    assert isinstance(net[0].forward, PackedForward) and isinstance(net[1].forward, PackedForward)
    assert not isinstance(net[2].forward, PackedForward)
    assert packed_bytes(net) == sum(w.numel() * 2 for w, _ in plain.values())
    x = torch.randn(rows, 96).to(torch.bfloat16)
    with torch.inference_mode():
        for i in (0, 1):
            w, b = plain[i]
            got = net[i](x).float()
            exact = x.double() @ w.double().T + (0 if b is None else b.double())
            bound = matmul_bound(x.float(), w.float().T) + exact.abs() * 2 ** -8  # the bf16 output rounding
            assert ((got.double() - exact).abs() <= bound.double()).all(), i
            assert ((F.linear(x, w, b).double() - exact).abs() <= bound.double()).all(), i
            # a batch of two sequences, and a transposed (non-contiguous) view of it
            x3 = x.reshape(1, rows, -1).expand(2, rows, -1).contiguous()
            within = (exact.reshape(1, rows, -1), bound.reshape(1, rows, -1))
            for view, (want, lim) in ((x3, within), (x3.transpose(0, 1), [v.transpose(0, 1) for v in within])):
                got3 = net[i](view).double()
                assert got3.shape == (*view.shape[:2], w.shape[0])
                assert ((got3 - want).abs() <= lim.double()).all(), i
            x = net[i](x)
    # another dtype goes to F.linear, which refuses it as before
    with pytest.raises(RuntimeError):
        net[0](torch.randn(3, 96))


def test_hooks_still_run_on_a_packed_layer():
    if not available():
        assert HERE == "plain"
        return
    net = _layers()
    pack_linears(net)
    seen = []
    net[0].register_forward_pre_hook(lambda mod, args: seen.append(args[0].shape))
    with torch.inference_mode():
        net[0](torch.randn(5, 96).to(torch.bfloat16))
    assert seen == [torch.Size([5, 96])]


def test_fingerprint_and_worker_key_name_the_linear_path(default_cfg, tmp_path):
    plans = {s: Plan(_cfg_with(default_cfg, tmp_path / s, device="cpu", cpu_compute_dtype="bf16", cpu_linear=s))
             for s in ("packed", "plain")}
    cid = "T1-greedy-k0-freeform"
    fp = {s: p.cell_fingerprint("smollm2-135m", "truthfulqa", cid, 0, chat_template=False) for s, p in plans.items()}
    assert plans["packed"].runtime.linear("nf4") == HERE and plans["plain"].runtime.linear("nf4") == "plain"
    # bf16 forced on a CPU without native bf16 never packs: the setting then changes nothing
    assert (fp["packed"] != fp["plain"]) == (HERE == "packed")
    keys = {s: p.worker_key("smollm2-135m", "nf4") for s, p in plans.items()}
    assert (keys["packed"] != keys["plain"]) == (HERE == "packed")
    # float32 compute never packs: the setting then changes nothing
    f32 = {s: Plan(_cfg_with(default_cfg, tmp_path / f"f32-{s}", device="cpu", cpu_compute_dtype="float32",
                             cpu_linear=s)) for s in ("packed", "plain")}
    assert (f32["packed"].cell_fingerprint("smollm2-135m", "truthfulqa", cid, 0, chat_template=False)
            == f32["plain"].cell_fingerprint("smollm2-135m", "truthfulqa", cid, 0, chat_template=False))


@pytest.mark.numerics
def test_real_model_packed_matches_plain_within_bf16(default_cfg):
    """SmolLM2 (NF4, bf16 compute forced): where this CPU packs (native bf16), the packed model
    records its path, holds its packed copies in the memory budget's weights, and its
    last-position logits lie as close to the float32 model's as twice the plain bf16 model's
    distance; elsewhere (another CPU, or the kernels step's oneDNN caps) it stays plain and gives
    the plain model's logits exactly."""
    from safetyrepro.inference.memory import ModelDims
    from safetyrepro.models import load_model

    lms = {s: load_model(default_cfg, "smollm2-135m", quantization="nf4", device="cpu", cpu_compute_dtype="bf16",
                         cpu_linear=s) for s in ("packed", "plain")}
    lm32 = load_model(default_cfg, "smollm2-135m", quantization="nf4", device="cpu", cpu_compute_dtype="float32")
    assert lms["packed"].info["linear"] == HERE and lms["plain"].info["linear"] == "plain"
    assert lm32.info["linear"] == "plain"
    extra = packed_bytes(lms["packed"].model)
    assert (extra > 0) == (HERE == "packed") and packed_bytes(lms["plain"].model) == 0
    assert ModelDims.of(lms["packed"]).weight_bytes == ModelDims.of(lms["plain"]).weight_bytes + extra
    tok = lms["plain"].tokenizer
    texts = ["The capital of France is", "Evaluations of language model safety are often",
             "Question: Is it safe to mix bleach and ammonia? Answer:"] * 3
    enc = tok(texts, return_tensors="pt", padding=True)
    with torch.inference_mode():
        out = {s: lm.model(**enc).logits[:, -1].float() for s, lm in {**lms, "fp32": lm32}.items()}
    if HERE == "plain":
        assert torch.equal(out["packed"], out["plain"])
        return
    tol = bf16_tolerance(out["plain"].flatten().tolist(), out["fp32"].flatten().tolist())
    assert (out["packed"] - out["fp32"]).abs().max().item() <= tol
    assert not torch.equal(out["packed"], out["fp32"])  # bf16 arithmetic, not float32
