"""The dtype the CPU engine computes in (``runtime.cpu_compute_dtype``: auto | bf16 | float32).

An NF4 or bf16 model's effective weights are bf16 values; float32 holds each of them exactly, so
computing in float32 runs the same model with more precise arithmetic. ``auto`` computes in
bf16 only where the CPU multiplies bf16 natively (AMX, AVX512-BF16, Arm BF16): elsewhere oneDNN
emulates bf16 products: a bf16 GEMM runs 1.4-2.2x slower than a float32 one with oneDNN
capped on an AVX-512 CPU, 4.5x on an AVX2-only Zen 3, whose whole cells run 4.3-5.2x slower
(benchmarks/results/compute_dtype.json, compute_dtype_zen3.json). GPUs always compute NF4/bf16 models in bf16.
Standard library only (torch only for ``runtime.device: auto``): the workflow resolves it
when it plans the run.
"""

from __future__ import annotations

import os
import platform

SETTINGS = ("auto", "bf16", "float32")
# /proc/cpuinfo flags of CPUs with bf16 dot-product instructions (x86; Arm lists "bf16")
BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})
# oneDNN ISA caps (ONEDNN_MAX_CPU_ISA / DNNL_MAX_CPU_ISA) that leave out its bf16 kernels
ONEDNN_CAPS_WITHOUT_BF16 = frozenset({"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX512_CORE",
                                      "AVX512_CORE_VNNI"})


def cpuinfo(path: str = "/proc/cpuinfo") -> dict[str, str]:
    """``/proc/cpuinfo`` as ``{key: value}``, each key's first value (the first processor's);
    empty if the file cannot be read."""
    fields: dict[str, str] = {}
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if not line.strip() and fields:
                    break  # the end of the first processor's block
                key, sep, value = line.partition(":")
                if sep:
                    fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def cpu_model(path: str = "/proc/cpuinfo") -> str:
    """The CPU's model name (``platform``'s guess where cpuinfo has none)."""
    return cpuinfo(path).get("model name") or platform.processor() or platform.machine()


def cpu_flags(path: str = "/proc/cpuinfo") -> frozenset[str]:
    """The first processor's feature flags (x86 ``flags``, Arm ``Features``); empty if unknown."""
    info = cpuinfo(path)
    return frozenset((info.get("flags") or info.get("Features") or "").split())


def onednn_cap(env: dict[str, str] | None = None) -> str | None:
    env = os.environ if env is None else env
    cap = env.get("ONEDNN_MAX_CPU_ISA") or env.get("DNNL_MAX_CPU_ISA")
    return cap.strip().upper() if cap else None


def native_bf16(flags: frozenset[str] | None = None, env: dict[str, str] | None = None) -> bool:
    """Whether bf16 matrix products run natively here: a bf16 flag, and no oneDNN cap below it."""
    flags = cpu_flags() if flags is None else flags
    if not (flags & BF16_FLAGS):
        return False
    return onednn_cap(env) not in ONEDNN_CAPS_WITHOUT_BF16


def compute_dtype(setting: str, device: str, quantization: str,
                  flags: frozenset[str] | None = None, env: dict[str, str] | None = None) -> str:
    """``"float32"`` or ``"bfloat16"``: what a model of ``quantization`` (fp32 | bf16 | nf4)
    computes in on ``device`` (cpu | cuda) under ``setting`` (:data:`SETTINGS`)."""
    if setting not in SETTINGS:
        raise ValueError(f"cpu_compute_dtype {setting!r}: expected one of {', '.join(SETTINGS)}")
    if quantization == "fp32":
        return "float32"
    if device != "cpu" or setting == "bf16":
        return "bfloat16"
    if setting == "float32":
        return "float32"
    return "bfloat16" if native_bf16(flags, env) else "float32"


def planned_device(requested: str) -> str:
    """``cpu`` or ``cuda`` for ``runtime.device`` (``auto`` asks torch whether it sees a GPU)."""
    requested = str(requested or "auto").lower()
    if requested in ("cpu", "cuda"):
        return requested
    import torch  # deferred: only ``auto`` needs it

    return "cuda" if torch.cuda.is_available() else "cpu"


def describe_cpu() -> dict:
    """What decided ``auto``: the CPU, its bf16 flags and any oneDNN cap (for records)."""
    flags = cpu_flags()
    return {"cpu": cpu_model(), "bf16_flags": sorted(flags & BF16_FLAGS), "onednn_max_cpu_isa": onednn_cap(),
            "native_bf16": native_bf16(flags)}
