"""GPU smoke check of the paper setting: one short run per paper model that records what a
full `config/paper.yaml` run would meet, as one JSON record (benchmarks/results/gpu_smoke.json).

Per model of the config (prepared first: `safetyrepro prepare-model --config config/paper.yaml`
downloads the hub snapshots; the check itself never downloads):

* load: seconds, weights hash, quantization, NF4 kernel path, chat-template hash and whether
  the template has a system role;
* the rendered TruthfulQA T2 (role-framed) few-shot prompt of the first item and the stop
  tokens (ids and strings); for a Mistral tokenizer also whether the prompt's tokens equal
  Mistral's official rendering (mistral-common, v3 tokenizer);
* one TruthfulQA T4-k5 decode group (every decoding of the envelope: greedy + sampled seeds)
  over ``--items`` items at the config's batch size: wall seconds, forward passes split into
  prefill and decode steps with their seconds, seconds per decode step, generated tokens, peak
  device memory (CUDA: ``max_memory_allocated``/``reserved``; CPU: peak RSS);
* the out-of-memory path: the same group on ``--oom-items`` items with the process limited to
  ``--oom-fraction`` of the GPU's memory (``torch.cuda.set_per_process_memory_fraction``):
  whether it completed, its error if not, peak memory (CUDA only; on a CPU it says so);
* a ``--profile-steps``-step decode profile (torch.profiler): shares of the wall time in
  attention kernels, matrix multiplications, other operators and idle (no operator running on
  the device: launch overhead, Python, synchronisation);
* an extrapolated wall time of the config's whole grid for this model (formula in the record).

``--device cpu`` runs the same steps on a CPU (the test suite runs it on an embedded model with
tiny sizes); the record then says that nothing was measured on a GPU. Run on one GPU, the
defaults fit in about 10 minutes for the three paper models (load ~1 min each from local disk,
the rest ~2 min each).

    .venv/bin/python benchmarks/gpu_smoke.py --config config/paper.yaml
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import time

ATTENTION_OPS = ("attention", "sdpa", "flash", "fmha", "efficient", "softmax")
MATMUL_OPS = ("aten::mm", "aten::bmm", "aten::addmm", "matmul", "linear", "gemm", "gemv", "4bit",
              "dequantize")


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


class ForwardClock:
    """Counts and times the model's forward passes: a decode step feeds at most one query per
    stream of a prompt (``max_decode_queries``: its streams decode as columns of one cache row),
    a prefill feeds prompt tokens."""

    def __init__(self, model, device: str, max_decode_queries: int = 1):
        self.device, self.model, self.max_q = device, model, max_decode_queries
        self.rows: list[tuple[int, float]] = []
        self._t = None

    def _pre(self, module, args, kwargs):
        _sync(self.device)
        ids = kwargs.get("input_ids", args[0] if args else None)
        self._q = int(ids.shape[-1]) if ids is not None else 1
        self._t = time.perf_counter()

    def _post(self, module, args, kwargs, out):
        _sync(self.device)
        self.rows.append((self._q, time.perf_counter() - self._t))

    def __enter__(self):
        self._h = [self.model.register_forward_pre_hook(self._pre, with_kwargs=True),
                   self.model.register_forward_hook(self._post, with_kwargs=True)]
        return self

    def __exit__(self, *exc):
        for h in self._h:
            h.remove()

    def summary(self) -> dict:
        pre = [t for q, t in self.rows if q > self.max_q]
        dec = [t for q, t in self.rows if q <= self.max_q]
        return {"prefill_forwards": len(pre), "prefill_s": round(sum(pre), 4),
                "decode_steps": len(dec), "decode_s": round(sum(dec), 4),
                "s_per_decode_step": round(sum(dec) / len(dec), 5) if dec else None}


@contextlib.contextmanager
def peak_memory(device: str):
    import torch

    from safetyrepro.perf.machine import peak_rss_mib

    out: dict = {}
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    yield out
    if device == "cuda":
        out["peak_allocated_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
        out["peak_reserved_gib"] = round(torch.cuda.max_memory_reserved() / 2**30, 3)
    else:
        out["peak_rss_mib"] = round(peak_rss_mib(), 1)  # whole process, since it started


def environment(device: str) -> dict:
    import importlib.metadata as md

    import torch

    def v(pkg):
        try:
            return md.version(pkg)
        except md.PackageNotFoundError:
            return None

    env = {"device": device, "torch": torch.__version__, "torch_cuda": torch.version.cuda,
           "transformers": v("transformers"), "bitsandbytes": v("bitsandbytes"),
           "cuda_available": torch.cuda.is_available()}
    if device == "cuda":
        p = torch.cuda.get_device_properties(0)
        env.update(gpu=p.name, gpu_memory_gib=round(p.total_memory / 2**30, 2),
                   capability=f"{p.major}.{p.minor}", cudnn=torch.backends.cudnn.version(),
                   gpu_count=torch.cuda.device_count())
    return env


def rendered_prompt(cfg, lm, wl, shots: str) -> dict:
    from safetyrepro.hashing import text_hash
    from safetyrepro.inference.encoding import encode_prompt
    from safetyrepro.models.chat import fold_system
    from safetyrepro.tasks import load_task

    task = load_task("truthfulqa")
    n = cfg.rules.level("shots", shots)["n"]
    messages = task.build_messages(wl.items[0], "T2", wl.fewshot[:n])
    from safetyrepro.models import format_prompt

    prompt = format_prompt(lm.tokenizer, messages)
    ids = encode_prompt(lm.tokenizer, prompt)
    rec = {"cell": f"T2-greedy-{shots}-freeform", "item_id": wl.items[0]["item_id"],
           "prompt": prompt, "prompt_sha256": text_hash(prompt), "n_tokens": len(ids),
           "stop_token_ids": lm.stop_ids,
           "stop_tokens": lm.tokenizer.convert_ids_to_tokens(lm.stop_ids),
           "stop_strings": lm.stop_strings}
    if "[INST]" in lm.tokenizer.get_vocab():  # a Mistral tokenizer: check against the official rendering
        rec["mistral_common_equal"] = _mistral_common_equal(fold_system(lm.tokenizer, messages), ids)
    return rec


def _mistral_common_equal(messages, ids) -> bool | str:
    try:
        from pathlib import Path

        import mistral_common
        from mistral_common.protocol.instruct.messages import AssistantMessage, UserMessage
        from mistral_common.protocol.instruct.request import ChatCompletionRequest
        from mistral_common.tokens.tokenizers.mistral import MistralTokenizer
    except ImportError as exc:
        return f"not checked: {exc}"
    v3 = Path(mistral_common.__file__).parent / "data" / "mistral_instruct_tokenizer_240323.model.v3"
    kinds = {"user": UserMessage, "assistant": AssistantMessage}
    req = ChatCompletionRequest(messages=[kinds[m["role"]](content=m["content"]) for m in messages])
    return MistralTokenizer.from_file(str(v3)).encode_chat_completion(req).tokens == ids


def decode_group(cfg, lm, prompts, *, max_new_tokens: int, batch_size: int, device: str) -> dict:
    from safetyrepro import cells
    from safetyrepro.inference import generate_streams
    from safetyrepro.plan import Plan

    group = Plan(cfg).decode_group("truthfulqa", "T4-greedy-k5-freeform")
    levels = {d: cfg.rules.level("decoding", d) for d, _ in group}
    streams, _ = cells.group_streams(group, levels)
    with peak_memory(device) as mem, ForwardClock(lm.model, device, len(streams)) as clock:
        _sync(device)
        t0 = time.perf_counter()
        outs = generate_streams(lm, prompts, streams, max_new_tokens=max_new_tokens,
                                batch_size=batch_size)
        _sync(device)
        wall = time.perf_counter() - t0
    gen = [g.n_gen_tokens for out in outs for g in out]
    return {"group": [list(g) for g in group], "n_items": len(prompts), "n_streams": len(streams),
            "n_sequences": len(gen), "batch_size": batch_size, "max_new_tokens": max_new_tokens,
            "wall_s": round(wall, 3), "generated_tokens": sum(gen),
            "mean_generated_tokens": round(sum(gen) / max(len(gen), 1), 2),
            "share_hit_max_new_tokens": round(sum(n >= max_new_tokens for n in gen) / max(len(gen), 1), 3),
            "prompt_tokens_mean": round(sum(o.n_prompt_tokens for o in outs[0]) / max(len(prompts), 1), 1),
            **clock.summary(), **mem}


def oom_path(cfg, lm, prompts, *, fraction: float, max_new_tokens: int, batch_size: int,
             device: str) -> dict:
    if device != "cuda":
        return {"run": False, "reason": "no GPU: a memory fraction limits CUDA memory only"}
    import torch

    rec = {"run": True, "memory_fraction": fraction, "n_items": len(prompts), "batch_size": batch_size}
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(fraction, 0)
    try:
        t0 = time.perf_counter()
        res = decode_group(cfg, lm, prompts, max_new_tokens=max_new_tokens, batch_size=batch_size,
                           device=device)
        rec.update(completed=True, wall_s=round(time.perf_counter() - t0, 3),
                   decode_steps=res["decode_steps"], peak_allocated_gib=res.get("peak_allocated_gib"))
    except Exception as exc:  # noqa: BLE001 - recorded, it is what this step is for
        rec.update(completed=False, error=f"{type(exc).__name__}: {str(exc)[:1000]}")
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, 0)
        torch.cuda.empty_cache()
    return rec


def profile(lm, prompts, *, steps: int, batch_size: int, device: str) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile as tprofile

    from safetyrepro.inference import Stream, generate_streams

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    batch = prompts[:batch_size]
    with tprofile(activities=acts) as prof:
        _sync(device)
        t0 = time.perf_counter()
        generate_streams(lm, batch, [Stream(0.0, 1.0, 0)], max_new_tokens=steps, batch_size=batch_size)
        _sync(device)
        wall = time.perf_counter() - t0
    attr = "self_device_time_total" if device == "cuda" else "self_cpu_time_total"
    shares = {"attention": 0.0, "matmul": 0.0, "other_ops": 0.0}
    for ev in prof.key_averages():
        t = getattr(ev, attr, 0) or 0
        if device == "cuda" and getattr(ev, "device_type", None) is not None and \
                str(ev.device_type).endswith("CPU"):
            continue  # device time only
        name = ev.key.lower()
        if any(k in name for k in ATTENTION_OPS):
            shares["attention"] += t
        elif any(k in name for k in MATMUL_OPS):
            shares["matmul"] += t
        else:
            shares["other_ops"] += t
    wall_us = wall * 1e6
    busy = sum(shares.values())
    out = {k: round(v / wall_us, 4) for k, v in shares.items()}
    out["idle"] = round(max(0.0, 1.0 - busy / wall_us), 4)
    return {"steps": steps, "batch_items": len(batch), "wall_s": round(wall, 3),
            "time_basis": "device kernel time" if device == "cuda" else "operator self CPU time",
            "shares_of_wall": out,
            "note": "operators classified by name; on a CPU nested operator time can make busy "
                    "exceed wall (idle is then 0)"}


def extrapolate(cfg, lm, wl_by_bench, group_rec: dict) -> dict:
    """Wall time of the config's whole grid for this model from the measured T4-k5 group:
    decode = sum over free-form decode groups of batches x steps x seconds per decode step
    (steps: max_new_tokens, times the measured share of steps actually run for T4 groups);
    prefill = prompt tokens of every group and logprob cell / measured prefill tokens per second.
    The per-step time of the measured group (its batch size and its 11 streams per prompt) is
    applied to every group, so it is an estimate, not a measurement."""
    from safetyrepro.grid import Config
    from safetyrepro.inference.encoding import encode_prompt
    from safetyrepro.perf.workload import freeform_prompts, logprob_requests
    from safetyrepro.plan import Plan

    plan = Plan(cfg)
    s_step = group_rec["s_per_decode_step"] or 0.0
    prefill_tps = (group_rec["prompt_tokens_mean"] * group_rec["n_items"]) / max(group_rec["prefill_s"], 1e-9)
    t4_share = group_rec["decode_steps"] / max(1, math.ceil(group_rec["n_items"] / group_rec["batch_size"])
                                               * group_rec["max_new_tokens"])
    bs = int(cfg.data["generation"]["batch_size"])
    decode_s = prefill_tokens = 0.0
    seen = set()
    n_paper = {b: int(cfg.benchmark(b)["n_items"]) for b in cfg.benchmarks}
    for job in plan.jobs():
        c = job.config
        key = (job.benchmark, c.template, c.shots, c.scoring)
        if job.model != lm.info["model_key"] or key in seen:
            continue
        seen.add(key)
        wl = wl_by_bench[job.benchmark]
        scale = n_paper[job.benchmark] / len(wl.items)
        if c.scoring == "freeform":
            steps = cfg.max_new_tokens(job.benchmark, c.template)
            if c.template == "T4":
                steps *= min(1.0, t4_share)
            decode_s += math.ceil(n_paper[job.benchmark] / bs) * steps * s_step
            prompts = freeform_prompts(cfg, lm, wl, Config(c.template, "greedy", c.shots, c.scoring).id)
            prefill_tokens += scale * sum(len(encode_prompt(lm.tokenizer, p)) for p in prompts)
        else:
            contexts, cands = logprob_requests(cfg, lm, wl, c.id)
            toks = sum(len(encode_prompt(lm.tokenizer, x)) for x in contexts)
            toks += sum(len(lm.tokenizer(y, add_special_tokens=False)["input_ids"]) for cs in cands for y in cs)
            prefill_tokens += scale * toks
    prefill_s = prefill_tokens / prefill_tps
    return {"decode_s": round(decode_s, 1), "prefill_s": round(prefill_s, 1),
            "total_s": round(decode_s + prefill_s, 1), "prefill_tokens": int(prefill_tokens),
            "prefill_tokens_per_s": round(prefill_tps, 1), "s_per_decode_step": s_step,
            "t4_steps_share": round(t4_share, 3), "groups": len(seen),
            "method": extrapolate.__doc__.split("\n\n")[0].replace("\n", " ")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="config/paper.yaml")
    ap.add_argument("--models", nargs="*", default=None, help="model keys (default: all of the config)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--quantization", default=None, help="override the config's (e.g. fp32 on a CPU)")
    ap.add_argument("--items", type=int, default=64, help="items of the T4-k5 decode group")
    ap.add_argument("--batch-size", type=int, default=None, help="default: generation.batch_size")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="default: the config's T4 value")
    ap.add_argument("--oom-items", type=int, default=32)
    ap.add_argument("--oom-fraction", type=float, default=0.35)
    ap.add_argument("--profile-steps", type=int, default=20)
    ap.add_argument("--extrapolate-items", type=int, default=16,
                    help="items per benchmark rendered to count the grid's prompt tokens")
    ap.add_argument("--out", default=None, help="folder of the record (default benchmarks/results)")
    args = ap.parse_args(argv)

    import torch

    from safetyrepro.config import load_config
    from safetyrepro.models import load_model
    from safetyrepro.perf.report import save
    from safetyrepro.perf.workload import freeform_prompts, load_workload

    if args.device == "cuda" and not torch.cuda.is_available():
        from safetyrepro.models.load import cuda_problem

        print(f"error: --device cuda but {cuda_problem()}; use --device cpu for the CPU mode",
              file=sys.stderr)
        return 2
    cfg = load_config(args.config)
    keys = args.models or list(cfg.models)
    n_pool = max(args.items, args.oom_items, args.extrapolate_items)
    wl = load_workload(cfg, "truthfulqa", n_pool)
    wl_by_bench = {b: (wl if b == "truthfulqa" else load_workload(cfg, b, args.extrapolate_items))
                   for b in cfg.benchmarks}
    wl_by_bench["truthfulqa"] = type(wl)(wl.benchmark, wl.items[:args.extrapolate_items], wl.fewshot,
                                         wl.subset_hash)
    record = {"environment": environment(args.device), "config": args.config, "models": {},
              "measured_on_gpu": args.device == "cuda"}
    bs = args.batch_size or int(cfg.data["generation"]["batch_size"])
    max_new = args.max_new_tokens or cfg.max_new_tokens("truthfulqa", "T4")
    t_all = time.perf_counter()
    for key in keys:
        print(f"[gpu-smoke] {key}: loading", file=sys.stderr, flush=True)
        rec: dict = {}
        record["models"][key] = rec
        try:
            t0 = time.perf_counter()
            lm = load_model(cfg, key, quantization=args.quantization, device=args.device)
            rec["load"] = {"s": round(time.perf_counter() - t0, 2),
                           **{k: lm.info.get(k) for k in ("path", "weights_hash", "quantization",
                                                          "dtype", "nf4_matmul", "attention",
                                                          "chat_template_hash", "system_role")}}
            rec["t2_prompt"] = rendered_prompt(cfg, lm, wl, "k3")
            prompts = freeform_prompts(cfg, lm, wl, "T4-greedy-k5-freeform")
            print(f"[gpu-smoke] {key}: T4-k5 decode group", file=sys.stderr, flush=True)
            rec["t4_k5_group"] = decode_group(cfg, lm, prompts[:args.items], max_new_tokens=max_new,
                                              batch_size=bs, device=args.device)
            rec["oom_path"] = oom_path(cfg, lm, prompts[:args.oom_items], fraction=args.oom_fraction,
                                       max_new_tokens=max_new, batch_size=bs, device=args.device)
            rec["profile"] = profile(lm, prompts, steps=args.profile_steps, batch_size=bs,
                                     device=args.device)
            rec["extrapolated_paper_run"] = extrapolate(cfg, lm, wl_by_bench, rec["t4_k5_group"])
        except Exception as exc:  # noqa: BLE001 - the record says what failed, the others still run
            rec["error"] = f"{type(exc).__name__}: {str(exc)[:2000]}"
            print(f"[gpu-smoke] {key}: {rec['error']}", file=sys.stderr, flush=True)
        finally:
            lm = None
            if args.device == "cuda":
                torch.cuda.empty_cache()
    record["wall_s"] = round(time.perf_counter() - t_all, 1)
    totals = [m["extrapolated_paper_run"]["total_s"] for m in record["models"].values()
              if "extrapolated_paper_run" in m]
    record["extrapolated_paper_wall_s"] = round(sum(totals), 1) if len(totals) == len(keys) else None
    path = save("gpu_smoke" if args.device == "cuda" else "gpu_smoke_cpu_mode", record, args.out)
    print(f"written: {path}")
    return 1 if any("error" in m for m in record["models"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
