"""Benchmark 6: the CPU engine's model-level changes vs the model as transformers loads it.

Two variants of each model, loaded side by side in one process and run on the same real cells
of the default config through ``run_cell`` (what the worker runs), alternating:

* baseline: ``load_model(..., cpu_engine=False)`` -- bitsandbytes' 4-bit kernels for NF4 and
  transformers' ``sdpa`` attention; the engine keeps the shared prefix inside each batch's
  cache (copied per row);
* engine:   ``load_model(...)`` as runs use it on a CPU -- NF4 layers dequantised once at load
  (``safetyrepro.models.nf4``) and the engine's attention with the shared prefix detached from
  the batch caches (``safetyrepro.inference.attention``).

Everything else (batching, packed prefill and scoring, stream columns, reserved caches) is the
same code in both. Reports per (model, cell) the median seconds of each, the ratio, and how
many outputs are identical (free-form: the texts of every seed; logprob: the chosen answer).
The two compute the same model up to summation order, except that on CPUs with AVX512-BF16
bitsandbytes' kernel rounds each block's scale to bf16 (its generic path and the engine do
not), so NF4 outputs may differ slightly; in fp32 the engine's tokens equal the baseline's
(tests/inference/test_cpu_engine.py). Writes benchmarks/results/cpu_engine.json. Run: benchmarks/README.md.
"""

from __future__ import annotations

import sys
import tempfile

from safetyrepro.perf.args import cell_bench_parser

DEFAULT_CELLS = ["T1-greedy-k5-freeform", "T4-greedy-k0-freeform", "T4-t0.3-k5-freeform",
                 "T1-greedy-k5-logprob"]


def main(argv=None) -> int:
    ap = cell_bench_parser(__doc__, DEFAULT_CELLS)
    ap.add_argument("--models", nargs="+", default=["smollm2-135m", "qwen2.5-0.5b", "gemma3-270m"])
    args = ap.parse_args(argv)

    import pyarrow.parquet as pq
    import torch

    from safetyrepro.cells import ModelCellRunner, run_cell
    from safetyrepro.models import load_model
    from safetyrepro.perf.report import publish
    from safetyrepro.perf.timing import alternate
    from safetyrepro.perf.workload import cell_bench_setup

    try:
        cfg, plan, load_start = cell_bench_setup(args.config, args.benchmark, args.threads)
    except FileNotFoundError as exc:  # the run's items are missing
        print(exc, file=sys.stderr)
        return 2
    out_dir = tempfile.mkdtemp(prefix="bench_cpu_engine-")

    def runner(lm, model: str, cell: str, name: str):
        worker = ModelCellRunner(lm)
        sampled = "greedy" not in cell
        column = "raw_output" if cell.endswith("freeform") else "chosen_index"

        def run():
            outs = []
            for s in range(cfg.n_seeds(cell.split("-")[1]) if sampled else 1):
                path = f"{out_dir}/{model}-{cell}-{name}-s{s}.parquet"
                run_cell(plan.cell_request(model, args.benchmark, cell, s, path), worker, progress=False)
                outs.extend(pq.read_table(path, columns=[column]).column(0).to_pylist())
            return outs
        return run

    rows, records = [], []
    for model in args.models:
        base = load_model(cfg, model, cpu_engine=False)
        engine = load_model(cfg, model)
        print(f"# {model}: baseline {base.info.get('nf4_matmul')} + {base.info['attention']}; "
              f"engine {engine.info.get('nf4_matmul')} + {engine.info['attention']}; "
              f"{torch.get_num_threads()} thread(s)", flush=True)
        for cell in args.cells:
            runner(engine, model, cell, "warm")()  # warm-up (first-call allocations)
            timed = alternate({"baseline": runner(base, model, cell, "baseline"),
                               "engine": runner(engine, model, cell, "engine")}, args.rounds)
            a, b = timed.results["baseline"], timed.results["engine"]
            same = sum(x == y for x, y in zip(a, b))
            ratio = timed.ratio("baseline", "engine")
            rows.append([model, cell, timed.median("baseline"), timed.median("engine"),
                         f"{ratio:.2f}x", f"{same}/{len(a)}"])
            records.append({"model": model, "cell": cell, "times_s": timed.times, "ratio": ratio,
                            "paired_ratios": timed.paired_ratios("baseline", "engine"),
                            "identical_outputs": same, "n_outputs": len(a),
                            "baseline": {k: base.info.get(k) for k in ("nf4_matmul", "attention")},
                            "engine": {k: engine.info.get(k) for k in ("nf4_matmul", "attention")}})
        del base, engine
    publish("cpu_engine", ["model", "cell", "baseline s (median)", "engine s (median)", "speed-up",
                           "outputs identical"], rows,
            {"benchmark": args.benchmark, "threads": torch.get_num_threads(),
             "loadavg_start": load_start, "records": records}, out_dir=args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
