"""Benchmark 17: bf16 vs float32 compute of the same NF4 weights on this CPU, natively and with
oneDNN capped below its bf16 kernels (what a CPU without AMX / AVX512-BF16 runs).

For each ISA setting (a subprocess each: ``native``, and, where the CPU has native bf16,
``ONEDNN_MAX_CPU_ISA=AVX512_CORE`` on an AVX-512 CPU or ``AVX2`` otherwise) the script times

* a GEMM probe, ``[64, 576] x [576, 49152]`` (SmolLM2's vocabulary projection of a prefill
  batch) and ``[16, 576] x [576, 49152]`` (a decode step), bf16 vs float32;
* real cells of the default config through ``run_cell`` on each model loaded twice
  (``cpu_compute_dtype`` bf16 and float32, the same weights), alternating, with how many outputs
  agree (free-form texts of every seed, logprob choices);

and records what ``auto`` picks there. The record (``benchmarks/results/compute_dtype.json``)
is the basis of ``auto``'s rule (:mod:`safetyrepro.compute_dtype`).

    .venv/bin/python benchmarks/bench_compute_dtype.py [--models ...] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from safetyrepro.perf.args import bench_parser

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CELLS = ["T1-greedy-k0-freeform", "T4-greedy-k0-freeform", "T1-greedy-k5-logprob"]


def gemm_probe(rounds: int = 20) -> dict:
    import torch

    w32 = torch.randn(49152, 576)
    out = {}
    for rows in (64, 16):
        x32 = torch.randn(rows, 576)
        for name, dt in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
            x, w = x32.to(dt), w32.to(dt)
            for _ in range(3):
                torch.nn.functional.linear(x, w)
            times = []
            for _ in range(rounds):
                t = time.perf_counter()
                torch.nn.functional.linear(x, w)
                times.append(time.perf_counter() - t)
            out[f"{rows}x576x49152_{name}_ms"] = round(1e3 * statistics.median(times), 3)
        out[f"{rows}x576x49152_bf16_over_fp32"] = round(out[f"{rows}x576x49152_bfloat16_ms"]
                                                        / out[f"{rows}x576x49152_float32_ms"], 3)
    return out


def child(args) -> dict:
    import pyarrow.parquet as pq
    import torch

    from safetyrepro.cells import ModelCellRunner, run_cell
    from safetyrepro.config import load_config
    from safetyrepro.models import load_model
    from safetyrepro.compute_dtype import compute_dtype, describe_cpu
    from safetyrepro.perf.timing import alternate
    from safetyrepro.plan import Plan

    cfg = load_config(args.config)
    plan = Plan(cfg)
    out_dir = tempfile.mkdtemp(prefix="bench_compute_dtype-")
    rec = {"cpu": describe_cpu(), "auto_picks": compute_dtype("auto", "cpu", "nf4"),
           "threads": torch.get_num_threads(), "gemm": gemm_probe(), "cells": []}

    def runner(lm, model, cell, name):
        worker = ModelCellRunner(lm)
        column = "raw_output" if cell.endswith("freeform") else "chosen_index"

        def run():
            outs = []
            for s in range(1 if "greedy" in cell else cfg.n_seeds(cell.split("-")[1])):
                path = f"{out_dir}/{model}-{cell}-{name}-s{s}.parquet"
                # no planned fingerprint: the plan names one compute dtype, the runs use both
                req = plan.cell_request(model, args.benchmark, cell, s, path).replace(fingerprint=None)
                run_cell(req, worker, progress=False)
                outs.extend(pq.read_table(path, columns=[column]).column(0).to_pylist())
            return outs
        return run

    for model in args.models:
        lms = {d: load_model(cfg, model, device="cpu", cpu_compute_dtype=d) for d in ("bf16", "float32")}
        for cell in args.cells:
            runner(lms["bf16"], model, cell, "warm")()
            timed = alternate({d: runner(lm, model, cell, d) for d, lm in lms.items()}, args.rounds)
            a, b = timed.results["bf16"], timed.results["float32"]
            rec["cells"].append({"model": model, "cell": cell, "times_s": timed.times,
                                 "bf16_s": timed.median("bf16"), "float32_s": timed.median("float32"),
                                 "bf16_over_float32": round(timed.ratio("bf16", "float32"), 3),
                                 "identical_outputs": sum(x == y for x, y in zip(a, b)), "n_outputs": len(a)})
            print(f"  {model} {cell}: bf16 {timed.median('bf16'):.2f} s, float32 "
                  f"{timed.median('float32'):.2f} s", file=sys.stderr, flush=True)
        del lms
    tot16 = sum(c["bf16_s"] for c in rec["cells"])
    tot32 = sum(c["float32_s"] for c in rec["cells"])
    rec["cells_total"] = {"bf16_s": round(tot16, 3), "float32_s": round(tot32, 3),
                          "bf16_over_float32": round(tot16 / tot32, 3) if tot32 else None}
    return rec


def main(argv=None) -> int:
    ap = bench_parser(__doc__)
    ap.add_argument("--models", nargs="+", default=["smollm2-135m", "qwen2.5-0.5b", "gemma3-270m"])
    ap.add_argument("--benchmark", default="truthfulqa")
    ap.add_argument("--cells", nargs="+", default=DEFAULT_CELLS)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "compute_dtype.json"))
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(child(a)))
        return 0
    from safetyrepro.compute_dtype import cpu_flags, native_bf16
    from safetyrepro.config import load_config
    from safetyrepro.items.build import build_items
    from safetyrepro.perf.machine import machine_info

    # the cells read the benchmark's item subset where the run keeps it (<results_dir>/items);
    # the same content-hashed files the workflow writes, left untouched where they exist
    build_items(load_config(a.config), a.benchmark)

    capped = "AVX512_CORE" if "avx512f" in cpu_flags() else "AVX2"
    # a CPU without native bf16 already runs oneDNN's kernels without bf16: a cap adds nothing
    settings = [("native", {})] + ([(f"onednn_{capped.lower()}", {"ONEDNN_MAX_CPU_ISA": capped})]
                                   if native_bf16() else [])
    record = {"benchmark": "compute_dtype", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
              "code_version": subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
                                             capture_output=True, text=True).stdout.strip(),
              "machine": machine_info(), "settings": {}}
    for name, env in settings:
        print(f"# {name} {env}", file=sys.stderr, flush=True)
        cmd = [sys.executable, __file__, "--child", "--config", a.config, "--benchmark", a.benchmark,
               "--rounds", str(a.rounds), "--models", *a.models, "--cells", *a.cells]
        r = subprocess.run(cmd, env={**os.environ, **env}, stdout=subprocess.PIPE, text=True)
        if r.returncode != 0:
            raise SystemExit(f"bench_compute_dtype: the {name} run failed (exit {r.returncode})")
        record["settings"][name] = {"env": env, **json.loads(r.stdout.strip().splitlines()[-1])}
    out = Path(a.out)
    out.write_text(json.dumps(record, indent=1) + "\n")
    print("| setting | auto picks | GEMM 64 rows bf16/fp32 | decode 16 rows bf16/fp32 | cells bf16 s | cells float32 s | bf16/float32 |")
    print("|---|---|---|---|---|---|---|")
    for name, s in record["settings"].items():
        g, c = s["gemm"], s["cells_total"]
        print(f"| {name} | {s['auto_picks']} | {g['64x576x49152_bf16_over_fp32']} | "
              f"{g['16x576x49152_bf16_over_fp32']} | {c['bf16_s']} | {c['float32_s']} | {c['bf16_over_float32']} |")
    print(f"record: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
