"""The project's engine next to vLLM on one decode group (benchmarks/gpu_vllm.py; docs/GPU_CHECK.md).

Both engines get the same requests, built once here (:func:`group_requests`): the cell's
rendered prompts as token ids (:func:`safetyrepro.inference.encoding.encode_prompt`), the decode
group's streams (greedy + each sampled decoding's seeds, as a cell runs them), the model's stop
token ids and stop strings, and per (item, stream) seed the project derives from the cell seed
and the prompt (:func:`safetyrepro.inference.sampling.item_seed`). Only greedy answers are
compared item by item (sampled draws come from different random generators, so they agree by
chance only): each engine's text is scored by the task's own parser (:func:`compare_answers`).

The vLLM call is :func:`run_vllm`, the one function that imports vLLM (a GPU build; vLLM's CPU
build does not run on the project's CPU machines); everything else runs, and is tested, on a CPU.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from ..cells import group_streams
from ..config import absolute_paths, config_folder
from ..errors import ConfigError
from ..grid import config_of
from ..plan import Plan
from ..tasks import load_task
from .workload import freeform_prompts, logprob_requests

DECODE_CONFIG = "T4-greedy-k5-freeform"  # gpu_smoke.py's decode group
LOGPROB_CONFIG = "T1-greedy-k0-logprob"


@dataclass
class GroupRequests:
    """One decode group's requests, engine-neutral."""

    benchmark: str
    config_id: str
    group: list[tuple[str, int]]          # (decoding, n_seeds), as the plan groups them
    items: list[dict]
    prompts: list[str]
    prompt_ids: list[list[int]]
    streams: list                         # safetyrepro.inference.Stream
    max_new_tokens: int
    stop_ids: list[int]
    stop_strings: list[str]

    @property
    def greedy_stream(self) -> int:
        return next(i for i, s in enumerate(self.streams) if s.temperature == 0)


def local_model_config(config_path: str | Path, model_dirs: dict[str, str], out_path: str | Path,
                       models: list[str] | None = None) -> Path:
    """A copy of run config ``config_path`` whose models ``model_dirs`` (key -> folder) load
    from local folders (``source: {kind: local, path}``), keeping only ``models`` (default:
    the keys of ``model_dirs``). A folder must be a Hugging Face model folder: config.json, the
    tokenizer files and the weights (*.safetensors), as `hf download <id> --local-dir` writes it."""
    config_path = Path(config_path)
    raw = yaml.safe_load(config_path.read_text())
    keep = list(models or model_dirs)
    for key in keep:
        if key not in raw.get("models", {}):
            raise ConfigError(config_path, f"models.{key}", f"no such model; configured: {sorted(raw['models'])}")
    for key, folder in model_dirs.items():
        if key not in keep:
            raise ConfigError(config_path, f"models.{key}", "a folder is given for a model that is not checked")
        if not (Path(folder) / "config.json").is_file():
            raise ConfigError(config_path, f"models.{key}.source.path",
                              f"{folder} is not a Hugging Face model folder (no config.json)")
    out = absolute_paths(copy.deepcopy(raw), config_folder(config_path))   # the copy lives elsewhere
    out["models"] = {k: out["models"][k] for k in keep}
    for key, folder in model_dirs.items():
        out["models"][key]["source"] = {"kind": "local", "path": str(Path(folder).resolve())}
    out_path = Path(out_path)
    out_path.write_text(yaml.safe_dump(out, sort_keys=False))
    return out_path


def group_requests(cfg, lm, wl, config_id: str = DECODE_CONFIG, *, n_items: int | None = None,
                   max_new_tokens: int | None = None) -> GroupRequests:
    """The requests of decode group ``config_id`` of ``wl`` (a :class:`.workload.Workload`)
    for model ``lm`` (its tokenizer renders and encodes the prompts)."""
    from ..inference.encoding import encode_prompt  # deferred: torch; the config helpers run without it

    items = wl.items[:n_items] if n_items else list(wl.items)
    prompts = freeform_prompts(cfg, lm, wl, config_id)[:len(items)]
    group = Plan(cfg).decode_group(wl.benchmark, config_id)
    levels = {d: cfg.rules.level("decoding", d) for d, _ in group}
    streams, _ = group_streams(group, levels)
    template = config_of(cfg.rules, config_id).template
    return GroupRequests(wl.benchmark, config_id, [tuple(g) for g in group], items, prompts,
                         [encode_prompt(lm.tokenizer, p) for p in prompts], streams,
                         int(max_new_tokens or cfg.max_new_tokens(wl.benchmark, template)),
                         list(lm.stop_ids), list(lm.stop_strings))


def sampling_params(req: GroupRequests) -> list[list[dict]]:
    """Per item, per stream: the keyword arguments of vLLM's ``SamplingParams`` (greedy is
    temperature 0; a sampled stream's seed is the project's per-item seed)."""
    from ..inference.sampling import item_seed  # deferred: torch; the config helpers run without it

    out = []
    for prompt in req.prompts:
        row = []
        for s in req.streams:
            kw = {"max_tokens": req.max_new_tokens, "temperature": float(s.temperature),
                  "top_p": float(s.top_p), "seed": item_seed(s.seed, prompt),
                  "stop_token_ids": list(req.stop_ids), "stop": list(req.stop_strings),
                  "skip_special_tokens": True}
            row.append(kw)
        out.append(row)
    return out


def run_project(lm, req: GroupRequests, *, batch_size: int, device: str) -> dict:
    """The project's engine on the group: texts[item][stream], seconds, peak memory."""
    from ..inference import generate_streams  # deferred: torch; the config helpers run without it

    cuda = device == "cuda"
    if cuda:
        import torch  # deferred: torch, CUDA only

        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    outs = generate_streams(lm, req.prompts, req.streams, max_new_tokens=req.max_new_tokens, batch_size=batch_size)
    if cuda:
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    rec = {"engine": "safetyrepro", "wall_s": round(wall, 3), "batch_size": batch_size,
           "texts": [[outs[s][i].text for s in range(len(req.streams))] for i in range(len(req.prompts))],
           "generated_tokens": sum(g.n_gen_tokens for out in outs for g in out)}
    if cuda:
        rec["peak_allocated_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
    return rec


def project_logprob_seconds(cfg, lm, wl, config_id: str = LOGPROB_CONFIG, *, batch_size: int,
                            n_items: int | None = None, device: str = "cpu") -> dict:
    """Seconds of one logprob cell with the project's scorer (same items as the decode group)."""
    from ..inference.scoring import score_candidates  # deferred: torch; the config helpers run without it

    contexts, cands = logprob_requests(cfg, lm, wl, config_id)
    n = n_items or len(contexts)
    if device == "cuda":
        import torch  # deferred: torch, CUDA only

        torch.cuda.synchronize()
    t0 = time.perf_counter()
    score_candidates(lm, contexts[:n], cands[:n], batch_size=batch_size)
    if device == "cuda":
        torch.cuda.synchronize()
    return {"config": config_id, "n_items": n, "wall_s": round(time.perf_counter() - t0, 3)}


def run_vllm(model_dir: str | Path, req: GroupRequests, *, quantization: str = "bitsandbytes",
             gpu_memory_utilization: float = 0.85, max_model_len: int | None = None) -> dict:
    """vLLM on the group (a GPU and a vLLM install needed): one ``LLM`` with bitsandbytes NF4
    quantization and prefix caching; every (item, stream) one request with its own
    ``SamplingParams`` (per-request seed). Returns texts[item][stream], load and generation
    seconds and the device memory in use (vLLM reserves ``gpu_memory_utilization`` of the card
    for weights and its key/value cache; ``torch.cuda.mem_get_info`` sees every process)."""
    import torch  # deferred: torch, GPU only
    from vllm import LLM, SamplingParams  # deferred: vLLM is optional (GPU build)
    from vllm.inputs import TokensPrompt  # deferred: vLLM is optional (GPU build)

    free0, total = torch.cuda.mem_get_info()
    t0 = time.perf_counter()
    kwargs = {"max_model_len": max_model_len} if max_model_len else {}
    llm = LLM(model=str(model_dir), quantization=quantization, enable_prefix_caching=True, dtype="bfloat16",
              gpu_memory_utilization=gpu_memory_utilization, seed=0, **kwargs)
    load_s = time.perf_counter() - t0
    params = sampling_params(req)
    prompts, sps = [], []
    for ids, row in zip(req.prompt_ids, params):
        for kw in row:
            prompts.append(TokensPrompt(prompt_token_ids=list(ids)))
            sps.append(SamplingParams(**kw))
    t0 = time.perf_counter()
    outs = llm.generate(prompts, sps, use_tqdm=False)
    wall = time.perf_counter() - t0
    free1, _ = torch.cuda.mem_get_info()
    k = len(req.streams)
    texts = [[outs[i * k + s].outputs[0].text for s in range(k)] for i in range(len(req.prompts))]
    gen = sum(len(o.outputs[0].token_ids) for o in outs)
    import vllm  # deferred: vLLM is optional (GPU build)

    return {"engine": "vllm", "vllm": vllm.__version__, "quantization": quantization, "prefix_caching": True,
            "load_s": round(load_s, 2), "wall_s": round(wall, 3), "texts": texts, "generated_tokens": gen,
            "device_memory_in_use_gib": round((total - free1) / 2**30, 3),
            "device_memory_in_use_before_gib": round((total - free0) / 2**30, 3),
            "gpu_memory_utilization": gpu_memory_utilization}


def compare_answers(req: GroupRequests, texts_a: list[list[str]], texts_b: list[list[str]],
                    names: tuple[str, str] = ("safetyrepro", "vllm"), max_listed: int = 20) -> dict:
    """Per-item agreement of the greedy answers of two engines: each text scored by the task's
    parser; ``answer_agreement`` = share of items with the same parsed answer (both unparseable
    counts as the same), ``text_agreement`` = share with the identical text."""
    if len(texts_a) != len(req.items) or len(texts_b) != len(req.items):
        raise ValueError(f"expected {len(req.items)} items per engine, got {len(texts_a)} and {len(texts_b)}")
    task = load_task(req.benchmark)
    g = req.greedy_stream
    same_answer = same_text = 0
    correct = {names[0]: 0, names[1]: 0}
    differ = []
    for item, ta, tb in zip(req.items, texts_a, texts_b):
        ra, rb = task.score_freeform(item, ta[g]), task.score_freeform(item, tb[g])
        correct[names[0]] += bool(ra.correct)
        correct[names[1]] += bool(rb.correct)
        same_text += ta[g] == tb[g]
        if ra.parsed_label == rb.parsed_label:
            same_answer += 1
        elif len(differ) < max_listed:
            differ.append({"item_id": item["item_id"], names[0]: ra.parsed_label, names[1]: rb.parsed_label})
    n = len(req.items)
    return {"benchmark": req.benchmark, "config": req.config_id, "stream": "greedy", "n_items": n,
            "answer_agreement": same_answer / n if n else None, "text_agreement": same_text / n if n else None,
            "score": {k: v / n if n else None for k, v in correct.items()}, "differing_items": differ}


__all__ = ["DECODE_CONFIG", "GroupRequests", "compare_answers", "group_requests", "local_model_config",
           "project_logprob_seconds", "run_project", "run_vllm", "sampling_params"]
