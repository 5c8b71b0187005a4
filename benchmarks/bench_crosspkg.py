"""Benchmark 10: the cross-package stage's cost on the default config's items and models.

Times, per model, the two package calls of ``safetyrepro.crosspkg.stage.run_stage`` (the
SafetyRepro rows are read from the run's item results and cost nothing):

* lm-eval (TruthfulQA MC1, BBQ, CrowS-Pairs through its own tasks on the run's item subsets,
  bf16) with each loop of :data:`~safetyrepro.crosspkg.stage.LMEVAL_LOOPS` side by side:
  ``stock`` (lm-eval's HFLM loading the folder; one forward per candidate: before) and
  ``shared-context`` (the stage's default: the model loaded by SafetyRepro, each context once:
  after), each including its model load;
* Inspect (multiple_choice + choice on TruthfulQA and BBQ, bf16 weights, greedy), one eval call
  per arithmetic of ``--inspect-compute``: ``bfloat16`` (the folder loaded in bf16) and
  ``float32`` (the bf16-rounded copy, :func:`~safetyrepro.crosspkg.stage.bf16_weights`, loaded
  in float32: what the stage runs on a CPU without native bf16); with both, how many items
  the two choose alike.

Per call: wall seconds, CPU seconds of this process (less sensitive to other load on a shared
machine than wall time), the token positions the model computed (inputs of every forward,
padding included) and the scores; per model, how many items the two loops choose alike. The
item subsets are built from the config's own rules into a temporary folder. Compare the total
with the default run's time (benchmarks/results/default_run.json; the stage should add at most
~10%).

Prints a table and writes benchmarks/results/crosspkg.json. Run:
    .venv/bin/python benchmarks/bench_crosspkg.py [--models smollm2-135m ...] [--loops shared-context]
"""

from __future__ import annotations

import atexit
import gc
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from safetyrepro.perf.args import bench_parser


class _Count:
    """Token positions through a model's forward (a pre-hook on the top module)."""

    def __init__(self):
        self.positions = 0
        self.calls = 0

    def __call__(self, module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None:
            self.positions += int(ids.numel())
            self.calls += 1


def _same_choice(a: dict, b: dict) -> dict:
    """Per benchmark, how many items two runs' ``{benchmark: {item: choice}}`` choose alike."""
    return {bb: f"{sum(a[bb][i] == b[bb][i] for i in a[bb])}/{len(a[bb])}" for bb in a}


def _timed(fn):
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w, time.process_time() - c


def main(argv=None) -> int:
    ap = bench_parser(__doc__)
    ap.add_argument("--models", nargs="+", default=None, help="default: the config's models")
    ap.add_argument("--loops", nargs="+", default=["stock", "shared-context"], help="lm-eval loops to time")
    ap.add_argument("--no-inspect", action="store_true", help="time lm-eval only")
    ap.add_argument("--inspect-compute", nargs="+", default=["bfloat16"], choices=["bfloat16", "float32"],
                    help="Inspect's arithmetic, each timed (float32 over the bf16-rounded copy)")
    ap.add_argument("--name", default="crosspkg", help="record name (results/<name>.json)")
    ap.add_argument("--out", default=None, help="results folder (default benchmarks/results)")
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

    from transformers import PreTrainedModel

    from safetyrepro.config import load_config
    from safetyrepro.crosspkg.stage import (INSPECT_BENCHMARKS, LMEVAL_BENCHMARKS, bf16_weights, inspect_rows,
                                             lmeval_rows)
    from safetyrepro.items import read_items
    from safetyrepro.items.build import build_items
    from safetyrepro.models.load import load_model
    from safetyrepro.models.prepare import prepare_model
    from safetyrepro.perf.report import publish

    cfg = load_config(args.config)
    load_start = [round(x, 2) for x in os.getloadavg()]
    work = Path(tempfile.mkdtemp(prefix="bench-crosspkg-"))
    atexit.register(shutil.rmtree, work, ignore_errors=True)   # items, logs, bf16 copies (~2 GB)
    benches = [b for b in cfg.benchmarks if b in set(LMEVAL_BENCHMARKS) | set(INSPECT_BENCHMARKS)]
    items = {}
    for b in benches:
        build_items(cfg, b, work / "items")
        items[b] = read_items(work / "items" / f"{b}.parquet")[0]

    # count every forward of any transformers model (lm-eval's, the engine's, Inspect's)
    counter = _Count()
    orig_init = PreTrainedModel.post_init

    def post_init(self):
        orig_init(self)
        if type(self).__name__.endswith("ForCausalLM"):
            self.register_forward_pre_hook(counter, with_kwargs=True)

    PreTrainedModel.post_init = post_init

    rows, records = [], []
    for m in args.models or cfg.models:
        folder = str(prepare_model(cfg, m, progress=False))
        rec = {"model": m, "n_items": {b: len(v) for b, v in items.items()}, "lmeval": {}}
        chosen = {}
        for loop in args.loops:
            counter.positions = counter.calls = 0

            def run(loop=loop):
                engine = load_model(cfg, m, quantization="bf16") if loop == "shared-context" else None
                return lmeval_rows(folder, m, items, {}, work / m / loop, engine=engine, loop=loop)

            lm, wall, cpu = _timed(run)
            gc.collect()
            chosen[loop] = {r["benchmark"]: r["chosen"] for r in lm}
            rec["lmeval"][loop] = {"wall_s": wall, "cpu_s": cpu, "positions": counter.positions,
                                   "forwards": counter.calls,
                                   "scores": {r["benchmark"]: r["score"] for r in lm},
                                   "precision": lm[0]["precision"] if lm else None}
            rows.append([m, f"lm-eval {loop}", f"{wall:.1f}", f"{cpu:.1f}", str(counter.positions)])
        if len(chosen) == 2:
            rec["lmeval_loops_same_choice"] = _same_choice(*(chosen[x] for x in args.loops))
        ins_chosen = {}
        for dtype in ([] if args.no_inspect else args.inspect_compute):
            counter.positions = counter.calls = 0

            def run(dtype=dtype):
                # float32: the copy's preparation is timed with the call, as the stage pays it once per model
                src = str(bf16_weights(folder, work / m / "bf16_weights")) if dtype == "float32" else folder
                return inspect_rows(src, m, items, work / m / dtype, dtype=dtype)

            ins, wall, cpu = _timed(run)
            gc.collect()
            ins_chosen[dtype] = {r["benchmark"]: r["chosen"] for r in ins}
            rec.setdefault("inspect", {})[dtype] = {
                "wall_s": wall, "cpu_s": cpu, "positions": counter.positions, "forwards": counter.calls,
                "scores": {r["benchmark"]: r["score"] for r in ins}}
            rows.append([m, f"inspect {dtype}", f"{wall:.1f}", f"{cpu:.1f}", str(counter.positions)])
        if len(ins_chosen) == 2:
            rec["inspect_computes_same_choice"] = _same_choice(*ins_chosen.values())
        records.append(rec)
    stage_loop = "shared-context" if "shared-context" in args.loops else args.loops[-1]
    total = {f"{loop} + inspect {d}": sum(r["lmeval"][loop]["wall_s"] + r.get("inspect", {}).get(d, {}).get("wall_s", 0.0)
                                          for r in records)
             for loop in args.loops for d in args.inspect_compute}
    for what, t in total.items():
        rows.append(["total", f"lm-eval {what}", f"{t:.1f}", "", ""])
    publish(args.name, ["model", "call", "wall s", "cpu s", "positions"], rows,
            {"records": records, "total_wall_s": total, "stage_loop": stage_loop,
             "loadavg_start": load_start, "loadavg_end": [round(x, 2) for x in os.getloadavg()]},
            out_dir=args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
