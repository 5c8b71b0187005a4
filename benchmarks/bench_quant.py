"""Benchmark 5: NF4 vs bf16 vs fp32 on CPU for the embedded models: speed and memory.

Each (model, quantization) runs in its OWN subprocess (so peak memory is that configuration's
alone): load time, weight memory (parameters + buffers as stored), peak resident memory
(``ru_maxrss``) and its rise over the process's baseline before loading, prefill and
decode throughput (``safetyrepro.inference.bench.measure_speed``), and the wall time of two
realistic 12-item cells of the default config (TruthfulQA T1 greedy k0, free-form and
logprob) run through the engine exactly as a cell does. Prints a table and writes
benchmarks/results/quant.json. Run: see benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import os
import json
import subprocess
import sys
import time

from safetyrepro.perf.args import bench_parser

CELLS = ("T1-greedy-k0-freeform", "T1-greedy-k0-logprob")


def child(args) -> dict:
    import resource

    import torch

    torch.set_num_threads(args.threads)
    from safetyrepro.config import load_config
    from safetyrepro.inference import generate, score_candidates
    from safetyrepro.inference.bench import measure_speed
    from safetyrepro.models import load_model
    from safetyrepro.perf.workload import freeform_prompts, load_workload, logprob_requests

    def rss_mib() -> float:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * resource.getpagesize() / 2**20

    cfg = load_config(args.config)
    wl = load_workload(cfg, "truthfulqa", args.cell_items)
    base = rss_mib()
    t0 = time.perf_counter()
    lm = load_model(cfg, args.child[0], quantization=args.child[1], device="cpu")
    load_s = time.perf_counter() - t0
    loaded = rss_mib()
    weights = sum(t.numel() * t.element_size() for t in
                  list(lm.model.parameters()) + list(lm.model.buffers())) / 2**20
    speed = measure_speed(lm, batch_size=args.bs, prompt_tokens=args.prompt_tokens,
                          new_tokens=args.new_tokens, repeats=1)
    cells = {}
    for cell in CELLS:
        t0 = time.perf_counter()
        if cell.endswith("freeform"):
            prompts = freeform_prompts(cfg, lm, wl, cell)
            generate(lm, prompts, max_new_tokens=cfg.max_new_tokens("truthfulqa", "T1"),
                     temperature=0, batch_size=cfg.data["generation"]["batch_size"])
        else:
            ctx, cands = logprob_requests(cfg, lm, wl, cell)
            score_candidates(lm, ctx, cands, batch_size=cfg.data["generation"]["batch_size"])
        cells[cell] = time.perf_counter() - t0
    return {"model": args.child[0], "quantization": args.child[1], "load_s": load_s,
            "rss_before_load_mib": base, "rss_loaded_mib": loaded,
            "weights_mib": weights,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "prefill_tok_s": speed["prefill_tok_s"], "decode_tok_s": speed["decode_tok_s"],
            "decode_step_ms": speed["decode_step_ms"], "cells_s": cells,
            "threads": torch.get_num_threads()}


def main(argv=None) -> int:
    ap = bench_parser(__doc__)
    ap.add_argument("--models", nargs="+", default=["smollm2-135m", "qwen2.5-0.5b", "gemma3-270m"])
    ap.add_argument("--quantizations", nargs="+", default=["fp32", "bf16", "nf4"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--bs", type=int, default=8, help="measure_speed batch size")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--cell-items", type=int, default=12, help="items of the realistic cells")
    ap.add_argument("--child", nargs=2, metavar=("MODEL", "QUANT"), help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.child:
        print("RESULT " + json.dumps(child(args)), flush=True)
        return 0

    from safetyrepro.perf.report import publish

    import torch

    torch.set_num_threads(args.threads)
    load_start = [round(x, 2) for x in os.getloadavg()]

    print(f"# quantization: {len(args.models)} models x {args.quantizations}, CPU, "
          f"{args.threads} thread(s); one subprocess each", flush=True)
    records = []
    for key in args.models:
        for q in args.quantizations:
            cmd = [sys.executable, __file__, "--child", key, q, "--config", args.config,
                   "--threads", str(args.threads), "--bs", str(args.bs),
                   "--prompt-tokens", str(args.prompt_tokens), "--new-tokens", str(args.new_tokens),
                   "--cell-items", str(args.cell_items)]
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
            if proc.returncode or not lines:
                print(proc.stdout[-2000:] + proc.stderr[-4000:], file=sys.stderr)
                raise SystemExit(f"{key} {q}: child failed (exit {proc.returncode})")
            rec = json.loads(lines[-1][len("RESULT "):])
            records.append(rec)
            print(f"  {key:<14s} {q:<5s} load {rec['load_s']:5.1f} s, weights "
                  f"{rec['weights_mib']:6.0f} MiB, peak RSS {rec['peak_rss_mib']:6.0f} MiB, prefill "
                  f"{rec['prefill_tok_s']:7.1f} tok/s, decode {rec['decode_tok_s']:6.1f} tok/s "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)
    rows = []
    for r in records:
        ref = next(x for x in records if x["model"] == r["model"] and x["quantization"] == "bf16") \
            if "bf16" in args.quantizations else r
        rows.append([r["model"], r["quantization"], r["load_s"], f"{r['weights_mib']:.0f}",
                     f"{r['peak_rss_mib']:.0f}", f"{r['peak_rss_mib'] - r['rss_before_load_mib']:.0f}",
                     f"{r['prefill_tok_s']:.0f}",
                     f"{r['decode_tok_s']:.1f}",
                     f"{r['cells_s'][CELLS[0]]:.1f}", f"{r['cells_s'][CELLS[1]]:.1f}",
                     f"{ref['prefill_tok_s'] and r['prefill_tok_s'] / ref['prefill_tok_s']:.2f}",
                     f"{r['decode_tok_s'] / ref['decode_tok_s']:.2f}",
                     f"{r['weights_mib'] / ref['weights_mib']:.2f}"])
    publish("quant", ["model", "quant", "load s", "weights MiB", "peak RSS MiB", "peak - baseline MiB",
                      "prefill tok/s", "decode tok/s", "12-item freeform s", "12-item logprob s",
                      "prefill vs bf16", "decode vs bf16", "weights vs bf16"], rows,
            {"records": records, "threads": args.threads, "loadavg_start": load_start,
             "measure_speed": {"batch_size": args.bs, "prompt_tokens": args.prompt_tokens,
                               "new_tokens": args.new_tokens}},
            out_dir=args.out, note=f"measure_speed batch {args.bs}, {args.prompt_tokens} prompt "
                                   f"tokens, {args.new_tokens} new tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
