"""NF4 on the CPU: dequantise each 4-bit layer once at load instead of at every matmul.

An ``nf4`` model is loaded through bitsandbytes as on a GPU: every linear layer's weight is
quantised to 4-bit NormalFloat blocks (``Linear4bit``). The model under study is that
quantised model, i.e. the effective weights ``dequantize_4bit(q, state)`` with bf16 compute.

On a CUDA device bitsandbytes' fused kernels multiply with the packed weights directly. On a
CPU there is no such kernel worth the name: bitsandbytes' generic CPU path dequantises the
whole weight and then runs a plain bf16 ``linear`` on every call, and its AVX512-BF16 path
(on CPUs that have it) is a tiled GEMV kernel that measured 3x slower than a bf16 GEMM on the
same effective weights here. Memory is not what limits the embedded models on a CPU, so
:func:`dequantize_linear4bit` does the dequantisation ONCE per layer: each ``Linear4bit`` is
replaced by a bf16 ``torch.nn.Linear`` holding exactly the weights bitsandbytes'
``dequantize_4bit`` produces from its quantised state. The generic CPU path computes
``linear(x, dequantize_4bit(q, state))``, so the outputs are the same numbers (tested
bit-for-bit against ``bnb.matmul_4bit`` on that path); only the per-call dequantisation is
gone. Must run before the first forward: on AVX512-BF16 CPUs bitsandbytes repacks a layer's
weight into its kernel's layout (with a bf16-rounded block scale) on first use.

``model_info["nf4_matmul"]`` records which path a loaded model uses.
"""

from __future__ import annotations

import torch

DEQUANTIZED = "dequantized once to bfloat16 (CPU)"
BITSANDBYTES = "bitsandbytes 4-bit kernels"


def _linear4bit_class():
    import bitsandbytes as bnb
    return bnb.nn.Linear4bit


def dequantized_weight(layer) -> torch.Tensor:
    """The effective weight ``[out, in]`` of a ``Linear4bit`` layer, in its compute dtype."""
    import bitsandbytes.functional as bnbf

    state = layer.weight.quant_state
    if getattr(state, "packing_format_for_cpu", False):
        raise RuntimeError("the layer's weight was already repacked for bitsandbytes' CPU kernel "
                           "(it ran a forward); dequantise right after loading")
    w = bnbf.dequantize_4bit(layer.weight.data, state)
    dtype = layer.compute_dtype or state.dtype
    return w.to(dtype).reshape(layer.out_features, layer.in_features).contiguous()


def dequantize_linear4bit(model) -> int:
    """Replace every ``Linear4bit`` of ``model`` by a plain ``Linear`` with its effective
    weights (see the module docstring); returns how many layers were replaced."""
    linear4bit = _linear4bit_class()
    targets = [(name, mod) for name, mod in model.named_modules() if isinstance(mod, linear4bit)]
    for name, layer in targets:
        weight = dequantized_weight(layer)
        # skip_init: no random initialisation of weights that are overwritten next (a second
        # per load on Qwen2.5-0.5B's 168 layers)
        plain = torch.nn.utils.skip_init(torch.nn.Linear, layer.in_features, layer.out_features,
                                         bias=layer.bias is not None, device=weight.device,
                                         dtype=weight.dtype)
        with torch.no_grad():
            plain.weight.copy_(weight)
            if layer.bias is not None:
                plain.bias.copy_(layer.bias.to(weight.dtype))
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, plain)
    return len(targets)
