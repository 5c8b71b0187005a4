"""The project's engine next to vLLM on gpu_smoke.py's decode group (TruthfulQA T4-k5: greedy +
sampled seeds), per model from a local folder: seconds per decode group (and per logprob cell
for the project's scorer), peak memory, per-item agreement of the greedy answers. Writes
benchmarks/results/gpu_vllm.json (``--dry-run``: gpu_vllm_dry_run.json). docs/GPU_CHECK.md.

    .venv-vllm/bin/python benchmarks/gpu_vllm.py --config config/paper.yaml \\
        --model-dir qwen2.5-7b=/models/Qwen2.5-7B-Instruct --items 64

``--model-dir KEY=DIR``: a Hugging Face model folder (config.json, tokenizer files,
*.safetensors) for config model KEY; only those models are checked. ``--dry-run`` runs every
step but vLLM on the CPU (fp32): the requests, vLLM's sampling parameters and the comparison,
with the project's engine run a second time standing in for vLLM.
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="config/paper.yaml")
    ap.add_argument("--model-dir", action="append", default=[], metavar="KEY=DIR", required=True)
    ap.add_argument("--items", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=None, help="default: generation.batch_size")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="default: the config's T4 value")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    ap.add_argument("--dry-run", action="store_true", help="CPU, fp32, no vLLM (module doc)")
    ap.add_argument("--out", default=None, help="folder of the record (default benchmarks/results)")
    args = ap.parse_args(argv)

    from safetyrepro.config import load_config
    from safetyrepro.errors import SafetyReproError
    from safetyrepro.models import load_model
    from safetyrepro.perf import vllm_compare as vc
    from safetyrepro.perf.report import save
    from safetyrepro.perf.workload import load_workload

    try:
        dirs = dict(s.split("=", 1) for s in args.model_dir)
    except ValueError:
        print(f"error: --model-dir takes KEY=DIR (got {args.model_dir})", file=sys.stderr)
        return 2
    device = "cpu" if args.dry_run else "cuda"
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("error: no CUDA device; --dry-run runs the CPU part", file=sys.stderr)
            return 2
    with tempfile.TemporaryDirectory(prefix="gpu-vllm-") as tmp:
        try:
            cfg = load_config(vc.local_model_config(args.config, dirs, f"{tmp}/config.yaml"))
        except SafetyReproError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        wl = load_workload(cfg, "truthfulqa", args.items)
        bs = args.batch_size or int(cfg.data["generation"]["batch_size"])
        record = {"config": args.config, "dry_run": args.dry_run, "device": device, "models": {},
                  "decode_config": vc.DECODE_CONFIG, "logprob_config": vc.LOGPROB_CONFIG}
        for key, folder in dirs.items():
            rec: dict = {"folder": folder}
            record["models"][key] = rec
            try:
                t0 = time.perf_counter()
                lm = load_model(cfg, key, quantization="fp32" if args.dry_run else None, device=device)
                rec["project_load_s"] = round(time.perf_counter() - t0, 2)
                req = vc.group_requests(cfg, lm, wl, n_items=args.items, max_new_tokens=args.max_new_tokens)
                rec["requests"] = {"n_items": len(req.items), "n_streams": len(req.streams), "group": req.group,
                                   "max_new_tokens": req.max_new_tokens, "stop_ids": req.stop_ids,
                                   "stop_strings": req.stop_strings,
                                   "sampling_params_first_item": vc.sampling_params(req)[0]}
                proj = vc.run_project(lm, req, batch_size=bs, device=device)
                rec["project_logprob_cell"] = vc.project_logprob_seconds(cfg, lm, wl, batch_size=bs,
                                                                         n_items=args.items, device=device)
                if args.dry_run:
                    other = vc.run_project(lm, req, batch_size=bs, device=device)
                    other["engine"] = "safetyrepro (second run, standing in for vLLM in the dry run)"
                    names = ("safetyrepro", "stand_in")
                else:
                    lm = None
                    gc.collect()
                    torch.cuda.empty_cache()
                    other = vc.run_vllm(folder, req, gpu_memory_utilization=args.gpu_memory_utilization)
                    names = ("safetyrepro", "vllm")
                rec["comparison"] = vc.compare_answers(req, proj["texts"], other["texts"], names)
                rec["engines"] = {n: {k: v for k, v in r.items() if k != "texts"} for n, r in zip(names, (proj, other))}
                rec["greedy_texts_first_items"] = {n: [t[req.greedy_stream] for t in r["texts"][:3]]
                                                   for n, r in zip(names, (proj, other))}
            except Exception as exc:  # noqa: BLE001 - the record says what failed, the other models still run
                rec["error"] = f"{type(exc).__name__}: {str(exc)[:2000]}"
                print(f"[gpu-vllm] {key}: {rec['error']}", file=sys.stderr, flush=True)
            finally:
                lm = None
                gc.collect()
    path = save("gpu_vllm_dry_run" if args.dry_run else "gpu_vllm", record, args.out)
    print(f"written: {path}")
    return 1 if any("error" in m for m in record["models"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
