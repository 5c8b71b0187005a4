"""Benchmark 3b: a sampled cell's seeds as columns of one cache row vs one repeated cache row per seed.

Both variants prefill each batch once and decode all five seeds of a sampled config in one
forward per step (``safetyrepro.inference.generate_multi_seed``); they differ in how the
seeds share the prompt's keys/values during decoding:

* rows:    the prefilled cache rows are repeated once per seed (``stream_columns=False``);
* columns: each prompt keeps ONE cache row and its seeds are columns of it under a 4D mask
           (``stream_columns=True``, the default where the model allows it).

Runs the default config's real sampled cells through ``run_cell`` (same prompts, same model
as the workflow; quantization as configured), alternating the two variants, and reports the
median ratio and how many of the 60 (item, seed) outputs are identical. In fp32 the two are
identical (tests/inference/test_inference.py); with NF4/bf16 compute the different summation order can
flip a sampled token, so identity is reported, not assumed. Writes
benchmarks/results/seed_columns.json. Run: see benchmarks/README.md.
"""

from __future__ import annotations

import functools
import sys
import tempfile

from safetyrepro.perf.args import cell_bench_parser


def main(argv=None) -> int:
    ap = cell_bench_parser(__doc__, ["T1-t0.7-k5-freeform", "T4-t0.7-k0-freeform", "T4-t0.3-k5-freeform"])
    ap.add_argument("--model", default="smollm2-135m")
    args = ap.parse_args(argv)

    import pyarrow.parquet as pq
    import torch

    import safetyrepro.inference as inference
    from safetyrepro.cells import ModelCellRunner, run_cell
    from safetyrepro.inference.generate import generate_multi_seed
    from safetyrepro.perf.report import publish
    from safetyrepro.perf.timing import alternate
    from safetyrepro.perf.workload import cell_bench_setup

    try:
        cfg, plan, load_start = cell_bench_setup(args.config, args.benchmark, args.threads)
    except FileNotFoundError as exc:  # the run's items are missing
        print(exc, file=sys.stderr)
        return 2
    worker = ModelCellRunner.load(args.config, args.model)
    lm = worker.lm
    n_seeds = max(cfg.n_seeds(d) for d in ("t0.3", "t0.7"))
    out_dir = tempfile.mkdtemp(prefix="bench_seed_columns-")

    def runner(cell: str, columns: bool):
        def run():
            inference.generate_multi_seed = functools.partial(generate_multi_seed, stream_columns=columns)
            try:
                texts = []
                for s in range(n_seeds):
                    path = f"{out_dir}/{cell}-{int(columns)}-s{s}.parquet"
                    run_cell(plan.cell_request(args.model, args.benchmark, cell, s, path), worker,
                             progress=False)
                    texts.append(pq.read_table(path, columns=["raw_output"]).column(0).to_pylist())
                return texts
            finally:
                inference.generate_multi_seed = generate_multi_seed
        return run

    print(f"# seed columns vs repeated rows: {args.model} ({lm.info['quantization']}), "
          f"{args.benchmark}, {n_seeds} seeds, {torch.get_num_threads()} thread(s)", flush=True)
    rows, records = [], []
    for cell in args.cells:
        runner(cell, True)()  # warm-up (first-call allocations)
        timed = alternate({"rows": runner(cell, False), "columns": runner(cell, True)}, args.rounds)
        a, b = timed.results["rows"], timed.results["columns"]
        same = sum(x == y for sa, sb in zip(a, b) for x, y in zip(sa, sb))
        total = sum(len(sa) for sa in a)
        ratio = timed.ratio("rows", "columns")
        rows.append([cell, timed.median("rows"), timed.median("columns"), f"{ratio:.2f}x",
                     f"{same}/{total}"])
        records.append({"cell": cell, "times_s": timed.times, "ratio": ratio,
                        "paired_ratios": timed.paired_ratios("rows", "columns"),
                        "identical_outputs": same, "n_outputs": total})
    publish("seed_columns", ["cell", "rows s (median)", "columns s (median)", "speed-up",
                             "outputs identical"], rows,
            {"model": args.model, "quantization": lm.info["quantization"], "benchmark": args.benchmark,
             "threads": torch.get_num_threads(), "loadavg_start": load_start, "records": records},
            out_dir=args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
