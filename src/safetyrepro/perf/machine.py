"""What a benchmark ran on: CPU (its name, family/model and the vector and bf16 instructions
that decide a timing's meaning), cores, torch threads, library versions, load average; and
process memory (peak resident set size)."""

from __future__ import annotations

import os
import resource
import sys

from ..compute_dtype import cpu_flags, cpu_model, cpuinfo, describe_cpu
from ..sysutil import package_version

# the instruction sets that separate the CPU families this project is timed on
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def cpu_id(path: str = "/proc/cpuinfo") -> str | None:
    """``"family 25 model 1"`` (x86): a VM's model name is often only "AMD EPYC"."""
    fields = cpuinfo(path)
    if "cpu family" not in fields:
        return None
    return f"family {fields['cpu family']} model {fields.get('model', '?')}"


def cpu_isa(flags: frozenset[str] | None = None) -> str:
    """``"avx2 avx512f -avx512_bf16 -amx_bf16"``: which of :data:`ISA_FLAGS` the CPU has."""
    flags = cpu_flags() if flags is None else flags
    return " ".join(f if f in flags else f"-{f}" for f in ISA_FLAGS)


def machine_info() -> dict:
    import torch  # deferred: torch; describe and peak_rss_mib run without it

    mem_gib = None
    try:
        mem_gib = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError):
        pass
    return {
        "cpu": cpu_model(),
        "cpu_id": cpu_id(),
        "cpu_isa": cpu_isa(),
        "cores": os.cpu_count(),
        "memory_gib": mem_gib,
        "torch_threads": torch.get_num_threads(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": package_version("transformers"),
        "lm_eval": package_version("lm_eval"),
        "bitsandbytes": package_version("bitsandbytes"),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }


def describe(info: dict) -> str:
    """One line for a results table header."""
    dev = f", GPU {info['cuda']}" if info.get("cuda") else ""
    ident = "; ".join(x for x in (info.get("cpu_id"), info.get("cpu_isa")) if x)
    cpu = f"{info['cpu']} ({ident})" if ident else info["cpu"]
    return (f"{cpu}, {info['cores']} cores, {info['memory_gib']} GiB{dev}; torch "
            f"{info['torch']} ({info['torch_threads']} threads), transformers "
            f"{info['transformers']}, lm-eval {info['lm_eval']}; load average "
            f"{' / '.join(str(x) for x in info['loadavg'])} (1/5/15 min)")


def peak_rss_mib() -> float:
    """Peak resident set size of this process so far, MiB (Linux ru_maxrss is KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cpu_features() -> dict:
    """The CPU's bf16 support as the engine sees it (:mod:`safetyrepro.compute_dtype`) and
    torch's kernel level: what decides a timing's meaning across CPU families."""
    import torch  # deferred: torch; describe and peak_rss_mib run without it

    return {**describe_cpu(), "aten_cpu_capability": torch.backends.cpu.get_cpu_capability()}
