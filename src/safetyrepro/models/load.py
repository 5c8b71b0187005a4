"""Loading a prepared model with the requested quantisation on the run's device.

Quantisation levels (config ``models.<key>.quantization``, overridable per call):

* ``nf4``: bitsandbytes 4-bit NormalFloat weights, bf16 compute
  (``BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
  bnb_4bit_compute_dtype=torch.bfloat16)``); works on CPU (bitsandbytes >= 0.50) and CUDA.
  Non-linear parameters (embeddings, norms) are held in bf16.
* ``bf16``: all weights in bfloat16.
* ``fp32``: all weights in float32.

On a CPU, NF4 layers are dequantised once at load (:mod:`.nf4`: the same effective weights,
no per-call dequantisation) and attention runs the engine's implementation
(:mod:`safetyrepro.inference.attention`: grouped heads without copies, a batch's shared prefix
read once); on other devices it runs transformers' ``sdpa`` with grouped heads attended without
copies (``sdpa_grouped``). ``runtime.grouped_attention: false`` keeps transformers' copies of
keys/values per query head (``sdpa_engine_repeat`` / ``sdpa``). On a CPU an NF4/bf16 model
computes in bf16 or float32 (``runtime.cpu_compute_dtype``, :mod:`.compute_dtype`).
``info["nf4_matmul"]``, ``info["attention"]``, ``info["compute_dtype"]`` and ``info["linear"]``
(``packed``: bf16 linear layers on weights packed once for oneDNN, ``runtime.cpu_linear``;
``plain``: ``F.linear``) record what a model uses.

Device: ``runtime.device`` (``auto`` -> ``cuda`` when ``torch.cuda.is_available()``, else
``cpu``), overridable per call. ``runtime.threads`` sets ``torch.set_num_threads``. A config
that needs a GPU says ``runtime.device: cuda`` (``config/paper.yaml``): there a missing GPU is
an error before any job starts (:func:`require_device`, called by the workflow's ``onstart``
and by ``safetyrepro prepare-model``), never a silent run on the CPU.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError, ModelError
from ..compute_dtype import compute_dtype, native_bf16
from ..sysutil import package_version
from ..weights import recorded_weights_hash
from .chat import stop_strings_for, stop_token_ids, system_role, template_hash
from .packed_linear import available as packed_linear_available
from .packed_linear import pack_linears
from .packed_linear import resolve as resolve_linear
from .prepare import prepare_model

QUANTIZATIONS = ("nf4", "bf16", "fp32")


@dataclass
class LoadedModel:
    """A model ready for :mod:`safetyrepro.inference`.

    ``info`` records what was actually used: model_key, path, weights_hash, quantization,
    device, dtype, and the torch / transformers / bitsandbytes versions."""

    model: Any
    tokenizer: Any
    info: dict
    stop_ids: list[int] = field(default_factory=list)       # end-of-turn token ids
    stop_strings: list[str] = field(default_factory=list)   # plain-format turn markers
    cache_kwarg: str = "cache"                               # forward()'s KV-cache argument

    @property
    def device(self):
        import torch
        return torch.device(self.info["device"])


def compute_threads(cfg) -> int:
    """Threads for a model worker: ``runtime.threads``, else every core this process may run
    on (its CPU affinity: a Slurm allocation's cores, or the whole machine)."""
    import os

    threads = cfg.section("runtime").get("threads")
    if threads:
        return int(threads)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # platforms without sched_getaffinity
        return os.cpu_count() or 1


def cuda_problem() -> str | None:
    """Why torch cannot use a CUDA GPU here (None when it can): names the torch build."""
    import torch

    if torch.cuda.is_available():
        return None
    if not torch.version.cuda:
        return (f"the installed torch {torch.__version__} is a CPU-only build; install a CUDA "
                "build (`make` does so on a machine where nvidia-smi exists)")
    return (f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no CUDA device "
            "(no GPU, no driver, or CUDA_VISIBLE_DEVICES hides it)")


def require_device(cfg) -> str | None:
    """Fail early (ConfigError naming ``runtime.device``) when the config asks for ``cuda`` and
    torch cannot use one; returns the requested device. ``auto`` and ``cpu`` never fail."""
    requested = str(cfg.section("runtime").get("device", "auto")).lower()
    if requested == "cuda":
        problem = cuda_problem()
        if problem:
            raise ConfigError(cfg.path, "runtime.device",
                              f"'cuda' is required but {problem}; run on a GPU machine, or set "
                              "runtime.device: cpu (days instead of hours for 7-9B models)")
    return requested


def resolve_device(requested: str | None) -> str:
    import torch
    req = (requested or "auto").lower()
    if req == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if req == "cuda" and cuda_problem():
        raise ModelError(f"device 'cuda' requested (runtime.device) but {cuda_problem()}")
    if req not in ("cpu", "cuda"):
        raise ModelError(f"unknown device {requested!r}; expected auto, cpu or cuda")
    return req


def _load_kwargs(quantization: str, device: str) -> tuple[dict, str]:
    import torch
    if quantization == "fp32":
        return {"dtype": torch.float32}, "float32"
    if quantization == "bf16":
        return {"dtype": torch.bfloat16}, "bfloat16"
    if quantization == "nf4":
        from transformers import BitsAndBytesConfig
        qc = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                bnb_4bit_compute_dtype=torch.bfloat16)
        return {"dtype": torch.bfloat16, "quantization_config": qc}, "nf4/bfloat16"
    raise ModelError(f"unknown quantization {quantization!r}; expected one of {QUANTIZATIONS}")


def load_model(cfg, key: str, *, quantization: str | None = None,
               device: str | None = None, progress: bool = False,
               cpu_engine: bool = True, grouped_attention: bool | None = None,
               cpu_compute_dtype: str | None = None, cpu_linear: str | None = None) -> LoadedModel:
    """Prepare (if needed) and load model ``key`` of run config ``cfg``.

    ``quantization`` / ``device`` default to the config's ``models.<key>.quantization`` and
    ``runtime.device``. ``cpu_engine=False`` keeps the model as transformers and bitsandbytes
    load it (bitsandbytes' kernels, transformers' sdpa) also on a CPU: the baseline of
    ``benchmarks/bench_cpu_engine.py``. A model that fails to load raises ModelError naming
    the key and path. ``grouped_attention`` (default: ``runtime.grouped_attention``) selects
    grouped heads without key/value copies (:mod:`safetyrepro.inference.attention`).
    ``cpu_compute_dtype`` (default: ``runtime.cpu_compute_dtype``) picks bf16 or float32
    arithmetic on a CPU for the same weights (:mod:`.compute_dtype`). ``cpu_linear`` (default:
    ``runtime.cpu_linear``): ``packed`` runs bf16 linear layers on a CPU on weights packed once
    for oneDNN, ``plain`` on ``F.linear`` (:mod:`.packed_linear`); the engine only
    (``cpu_engine=False`` keeps ``F.linear``)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..inference.attention import attn_implementation, select_attention, use_attention

    spec = cfg.model(key)
    quant = quantization or cfg.quantization(key)
    if quant not in QUANTIZATIONS:
        raise ConfigError(cfg.path, f"models.{key}.quantization",
                          f"unknown quantization {quant!r}; expected one of {QUANTIZATIONS}")
    runtime = cfg.section("runtime")
    dev = resolve_device(device or runtime.get("device", "auto"))
    if runtime.get("threads"):
        torch.set_num_threads(int(runtime["threads"]))

    path = prepare_model(cfg, key, progress=progress)
    source = spec["source"]
    kwargs, dtype_name = _load_kwargs(quant, dev)
    from transformers.utils import logging as hf_logging
    bars = hf_logging.is_progress_bar_enabled()
    if not progress:
        hf_logging.disable_progress_bar()
    try:
        tok = AutoTokenizer.from_pretrained(str(path))
        model = AutoModelForCausalLM.from_pretrained(str(path), device_map={"": dev}, **kwargs)
    except Exception as exc:
        raise ModelError(f"model {key} ({path}) failed to load with quantization {quant} "
                         f"on {dev}: {type(exc).__name__}: {exc}") from exc
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    model.eval()
    nf4_matmul = None
    if quant == "nf4":
        from .nf4 import BITSANDBYTES, DEQUANTIZED, dequantize_linear4bit

        nf4_matmul = BITSANDBYTES
        if dev == "cpu" and cpu_engine and dequantize_linear4bit(model):
            nf4_matmul = DEQUANTIZED
    compute = compute_dtype(cpu_compute_dtype or runtime.get("cpu_compute_dtype", "auto"), dev, quant)
    if compute == "float32" and dev == "cpu" and cpu_engine and model.dtype != torch.float32:
        # the bf16 (or dequantised NF4) weights, exactly, in float32; nn.Module.to because
        # transformers refuses to cast a model it loaded through bitsandbytes
        torch.nn.Module.to(model, torch.float32)
    grouped = bool(runtime["grouped_attention"] if grouped_attention is None else grouped_attention)
    if dev != "cpu" or cpu_engine:  # cpu_engine=False: the model as transformers loads it
        use_attention(model, select_attention(engine=dev == "cpu", grouped=grouped))
    attention = attn_implementation(model)
    linear = resolve_linear(cpu_linear or runtime.get("cpu_linear", "packed"), dev,
                            str(model.dtype).removeprefix("torch.")) if cpu_engine else "plain"
    if linear == "packed":
        if not packed_linear_available():
            raise ModelError(f"model {key}: runtime.cpu_linear: packed, but oneDNN in torch "
                             f"{package_version('torch')} cannot pack bf16 weights on this CPU; "
                             "set runtime.cpu_linear: plain")
        pack_linears(model)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token if tok.eos_token is not None else tok.unk_token
        if tok.pad_token_id is None:
            raise ModelError(f"model {key} ({path}): tokenizer has no pad, eos or unk token")
    tok.padding_side = "left"

    whash = recorded_weights_hash(cfg.resources_dir, Path(path))
    info = {
        "model_key": key,
        "path": str(path),
        "source_kind": source["kind"],
        **({"hub_id": source["id"], "hub_revision": source["revision"]} if source["kind"] == "hub" else {}),
        "weights_hash": whash,
        "quantization": quant,
        "device": dev,
        "dtype": dtype_name,
        "compute_dtype": str(model.dtype).removeprefix("torch."),
        "cpu_native_bf16": native_bf16(),
        "torch_version": package_version("torch"),
        "transformers_version": package_version("transformers"),
        "bitsandbytes_version": package_version("bitsandbytes"),
        "chat_template": bool(getattr(tok, "chat_template", None)),
        "chat_template_hash": template_hash(tok),
        "system_role": system_role(tok),
        "attention": attention,
        "linear": linear,
        "threads": torch.get_num_threads(),
    }
    if nf4_matmul:
        info["nf4_matmul"] = nf4_matmul
    params = inspect.signature(model.forward).parameters
    cache_kwarg = "cache" if "cache" in params else "past_key_values"
    return LoadedModel(model=model, tokenizer=tok, info=info,
                       stop_ids=stop_token_ids(tok, model.generation_config),
                       stop_strings=stop_strings_for(tok), cache_kwarg=cache_kwarg)
