"""bf16 linear layers on a CPU with their weights packed once for oneDNN (``runtime.cpu_linear``).

torch's bf16 ``F.linear`` on a CPU gives oneDNN the weight in its plain ``[out, in]`` layout,
and oneDNN copies it into its blocked layout at every call. At the engine's batch sizes (one to
a few hundred rows) that copy costs about as much as the product itself. ``packed`` (the
default) does the copy once per layer at load (``torch.ops.mkldnn._reorder_linear_weight``) and
runs every call on the packed weight (``torch.ops.mkldnn._linear_pointwise``): 1.1-2.4x faster
per product on an AMX Xeon (benchmarks/RESULTS.md section 23).

The same weights and bf16 products with float32 sums, but not always the same kernel: for some
row counts oneDNN sums in another order than ``F.linear`` does (as ``F.linear`` itself does
between row counts), so a bf16 token or log-likelihood can differ in its last bits. The
resolved path is therefore part of every cell fingerprint, of the worker key and of the
numerics a shard records (``model_info["linear"]``). ``plain`` keeps ``F.linear``. Only where
the CPU multiplies bf16 natively (the test of ``cpu_compute_dtype: auto``,
:func:`..compute_dtype.native_bf16`): with bf16 forced on another CPU, or oneDNN capped below its
bf16 kernels, oneDNN has no bf16 reorder, and float32 compute and GPUs never pack (``plain``).

Resolution is standard library only (the workflow resolves it when it plans the run); torch is
imported where layers are packed.
"""

from __future__ import annotations

import functools

from ..compute_dtype import native_bf16

SETTINGS = ("packed", "plain")
ROWS_HINT = 256  # the row count oneDNN lays a packed weight out for (any count runs on it)


def resolve(setting: str, device: str, compute: str, native: bool | None = None) -> str:
    """``"packed"`` or ``"plain"``: the linear path of a model computing in ``compute``
    (``bfloat16`` | ``float32``) on ``device`` under ``runtime.cpu_linear`` = ``setting``, on a
    CPU with (``native``; default: this one's, :func:`..compute_dtype.native_bf16`) or without
    native bf16."""
    if setting not in SETTINGS:
        raise ValueError(f"cpu_linear {setting!r}: expected one of {', '.join(SETTINGS)}")
    if setting != "packed" or device != "cpu" or compute != "bfloat16":
        return "plain"
    return "packed" if (native_bf16() if native is None else native) else "plain"


@functools.lru_cache(maxsize=None)
def available() -> bool:
    """True where torch has oneDNN, the two operators packing needs, and oneDNN packs a bf16
    weight on this CPU (it refuses without AVX-512 BW/VL/DQ or AVX-NE-CONVERT, or when
    ``ONEDNN_MAX_CPU_ISA`` caps it below them)."""
    import torch

    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        return False
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(16, 16, dtype=torch.bfloat16), ROWS_HINT)
    except RuntimeError:
        return False
    return True


class PackedForward:
    """A bf16 linear layer's forward on its packed weight (a layer's ``forward`` attribute, so
    the module's hooks still run). Inputs of another dtype go to ``F.linear`` (which refuses
    them as before)."""

    def __init__(self, layer):
        import torch

        self.layer = layer
        self.packed = torch.ops.mkldnn._reorder_linear_weight(layer.weight.detach(), ROWS_HINT)
        # the two kernels, looked up once (every decode step calls every layer)
        self._packed_linear = torch.ops.mkldnn._linear_pointwise
        self._plain_linear = torch.nn.functional.linear

    def __call__(self, x):
        layer = self.layer
        if x.dtype != self.packed.dtype:
            return self._plain_linear(x, layer.weight, layer.bias)
        return self._packed_linear(x.contiguous(), self.packed, layer.bias, "none", [], "")


def pack_linears(model) -> int:
    """Run every bf16 ``nn.Linear`` of ``model`` on the CPU on a packed copy of its weight
    (:class:`PackedForward`); returns how many layers. The plain weight stays (tied embeddings
    and other readers use it), so the packed copies add their size again (:func:`packed_bytes`)."""
    import torch

    n = 0
    for module in model.modules():
        if (type(module) is torch.nn.Linear and module.weight.dtype == torch.bfloat16
                and module.weight.device.type == "cpu"):
            module.forward = PackedForward(module)
            n += 1
    return n


def packed_bytes(model) -> int:
    """Bytes the packed weight copies of ``model`` hold (outside its parameters)."""
    modules = getattr(model, "modules", None)
    if modules is None:
        return 0
    return sum(m.forward.packed.numel() * m.forward.packed.element_size()
               for m in modules() if isinstance(getattr(m, "forward", None), PackedForward))
