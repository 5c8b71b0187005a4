"""Benchmark 25: bf16 linear layers on weights packed once for oneDNN against F.linear.

``runtime.cpu_linear: packed`` (:mod:`safetyrepro.models.packed_linear`) packs every bf16
linear layer's weight at load; ``plain`` leaves the packing to oneDNN at every call. Two parts,
each timed ALTERNATELY in one process on this CPU:

* products: every distinct linear-layer shape of each model in ``--models`` (its own loaded
  weights) at ``--rows`` rows, F.linear against the packed forward (``--reps`` calls per timing,
  after one untimed warm-up of each);
* groups: whole decode groups (``--cases``, greedy + T=0.3 x 5 + T=0.7 x 5, ``generate_streams``
  as the worker runs it) on the model loaded twice, ``cpu_linear`` plain and packed, with the
  count of token-identical sequences (the sums can run in another order, so a bf16 token can
  differ).

bf16 compute is forced (``cpu_compute_dtype: bf16``). Packing applies only where the CPU has
native bf16 and oneDNN packs (:func:`safetyrepro.models.packed_linear.resolve`, ``available``);
elsewhere the script says so and exits 2. Writes benchmarks/results/packed_linear.json.
Run: benchmarks/README.md.
"""

from __future__ import annotations

import sys

from safetyrepro.perf.args import decode_group_parser

DEFAULT_CASES = ["qwen2.5-0.5b:bbq:T4:k0", "gemma3-270m:truthfulqa:T2:k5", "smollm2-135m:xstest:T1:k3"]
DEFAULT_MODELS = ["smollm2-135m", "gemma3-270m", "qwen2.5-0.5b"]


def product_rows(cfg, models: list[str], rows: list[int], reps: int, rounds: int) -> tuple[list, list]:
    import torch
    import torch.nn.functional as F

    from safetyrepro.models import load_model
    from safetyrepro.models.packed_linear import PackedForward
    from safetyrepro.perf.timing import alternate

    table, records = [], []
    for model in models:
        lm = load_model(cfg, model, device="cpu", cpu_compute_dtype="bf16", cpu_linear="plain")
        shapes = {}
        for name, mod in lm.model.named_modules():
            if type(mod) is torch.nn.Linear:
                shapes.setdefault((mod.in_features, mod.out_features, mod.bias is not None), (name, mod))
        for (k, n, bias), (name, layer) in sorted(shapes.items()):
            packed = PackedForward(layer)
            for m in rows:
                x = torch.randn(m, k).to(torch.bfloat16)

                def many(f):
                    def run():
                        with torch.inference_mode():
                            for _ in range(reps):
                                f(x)
                    return run
                sides = {"plain": many(lambda v: F.linear(v, layer.weight, layer.bias)), "packed": many(packed)}
                for run in sides.values():  # warm-up: oneDNN creates its primitive at the first call
                    run()
                timed = alternate(sides, rounds, log=None)
                ratio = timed.ratio("plain", "packed")
                table.append([model, name.rsplit(".", 1)[-1], f"{k}x{n}", m, timed.median("plain") / reps * 1e3,
                              timed.median("packed") / reps * 1e3, f"{ratio:.2f}x"])
                records.append({"model": model, "layer": name, "in": k, "out": n, "bias": bias, "rows": m,
                                "reps": reps, "times_s": timed.times, "ratio": ratio})
        del lm
    return table, records


def group_rows(config_path: str, cfg, cases: list[str], rounds: int) -> tuple[list, list]:
    from safetyrepro.inference import generate_streams
    from safetyrepro.inference.batching import BatchRecord
    from safetyrepro.inference.store import PrefillStore
    from safetyrepro.models import load_model
    from safetyrepro.perf.timing import alternate
    from safetyrepro.perf.workload import group_case, group_comparison

    table, records = [], []
    for case in cases:
        model, bench, template, shots = case.split(":")
        lms = {s: load_model(cfg, model, device="cpu", cpu_compute_dtype="bf16", cpu_linear=s)
               for s in ("plain", "packed")}
        gc = group_case(cfg, lms["plain"], bench, template, shots)

        def runner(lm):
            return lambda: generate_streams(lm, gc.prompts, gc.streams, store=PrefillStore(),
                                            record=BatchRecord(), **gc.kw)
        timed = alternate({s: runner(lm) for s, lm in lms.items()}, rounds)
        row, record = group_comparison((model, bench, template, shots), lms["packed"], gc, timed, "plain", "packed")
        table.append(row)
        records.append(record)
        del lms
    return table, records


def main(argv=None) -> int:
    ap = decode_group_parser(__doc__, DEFAULT_CASES)
    ap.add_argument("--models", nargs="*", default=DEFAULT_MODELS, help="models whose layer shapes to time")
    ap.add_argument("--rows", nargs="+", type=int, default=[1, 16, 64, 256])
    ap.add_argument("--reps", type=int, default=20, help="calls per timing of one product")
    args = ap.parse_args(argv)

    from safetyrepro.config import load_config
    from safetyrepro.models.packed_linear import available, resolve
    from safetyrepro.perf.report import publish
    from safetyrepro.perf.timing import format_table

    if resolve("packed", "cpu", "bfloat16") != "packed" or not available():
        print("bench_packed_linear: this CPU does not pack bf16 linear layers (no native bf16, or oneDNN "
              "capped below its bf16 kernels or unable to pack): runtime.cpu_linear resolves to plain "
              "here, so there is nothing to compare", file=sys.stderr)
        return 2
    cfg = load_config(args.config)
    products, product_records = product_rows(cfg, args.models, args.rows, args.reps, args.rounds)
    try:
        groups, group_records = group_rows(args.config, cfg, args.cases, args.rounds)
    except FileNotFoundError as exc:  # the run's items are missing
        print(exc, file=sys.stderr)
        return 2
    product_headers = ["model", "layer", "in x out", "rows", "F.linear ms", "packed ms", "speed-up"]
    print("\n" + format_table(product_headers, products))
    publish("packed_linear", ["model", "benchmark", "template-shots", "plain s (median)", "packed s (median)",
                              "speed-up", "identical sequences"], groups,
            {"records": group_records, "products": product_records,
             "products_table": format_table(product_headers, products)}, out_dir=args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
