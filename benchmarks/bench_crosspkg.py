"""Benchmark 10: the cross-package stage's cost on the default config's items and models.

Times, per model, lm-eval (TruthfulQA MC1, BBQ, CrowS-Pairs through its own tasks on the run's
item subsets, bf16) and Inspect (multiple_choice + choice on TruthfulQA and BBQ, bf16, greedy),
the two package calls of ``safetyrepro.crosspkg.stage.run_stage`` (the SafetyRepro rows are read
from the run's item results and cost nothing). The item subsets are built from the config's own
rules into a temporary folder. Compare the total with the default run's time (the stage should
add at most ~10%).

Prints a table and writes benchmarks/results/crosspkg.json. Run:
    .venv/bin/python benchmarks/bench_crosspkg.py [--models smollm2-135m ...]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="config/config.yaml")
    ap.add_argument("--models", nargs="+", default=None, help="default: the config's models")
    ap.add_argument("--out", default=None, help="results folder (default benchmarks/results)")
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

    from safetyrepro.config import load_config
    from safetyrepro.crosspkg.stage import INSPECT_BENCHMARKS, LMEVAL_BENCHMARKS, inspect_rows, lmeval_rows
    from safetyrepro.items import read_items
    from safetyrepro.items.build import build_items
    from safetyrepro.models.prepare import prepare_model
    from safetyrepro.perf.report import publish

    cfg = load_config(args.config)
    load_start = [round(x, 2) for x in os.getloadavg()]
    work = Path(tempfile.mkdtemp(prefix="bench-crosspkg-"))
    benches = [b for b in cfg.benchmarks if b in set(LMEVAL_BENCHMARKS) | set(INSPECT_BENCHMARKS)]
    items = {}
    for b in benches:
        build_items(cfg, b, work / "items")
        items[b] = read_items(work / "items" / f"{b}.parquet")[0]
    rows, records = [], []
    for m in args.models or cfg.models:
        folder = str(prepare_model(cfg, m, progress=False))
        t = time.perf_counter()
        lm = lmeval_rows(folder, m, items, {}, work / m)
        t_lm = time.perf_counter() - t
        t = time.perf_counter()
        ins = inspect_rows(folder, m, items, work / m)
        t_in = time.perf_counter() - t
        records.append({"model": m, "lmeval_s": t_lm, "inspect_s": t_in,
                        "scores": {f"{r['package']}/{r['benchmark']}": r["score"] for r in lm + ins},
                        "n_items": {b: len(v) for b, v in items.items()}})
        rows.append([m, f"{t_lm:.1f}", f"{t_in:.1f}", f"{t_lm + t_in:.1f}"])
    total = sum(r["lmeval_s"] + r["inspect_s"] for r in records)
    rows.append(["total", "", "", f"{total:.1f}"])
    publish("crosspkg", ["model", "lm-eval s", "inspect s", "stage s"], rows,
            {"records": records, "total_s": total, "loadavg_start": load_start,
             "loadavg_end": [round(x, 2) for x in os.getloadavg()]}, out_dir=args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
