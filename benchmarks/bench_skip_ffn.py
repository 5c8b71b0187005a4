"""Benchmark 20: decode steps whose finished streams' dummy columns skip the feed-forward blocks.

With stream columns, a prompt's finished streams keep a masked dummy column in every decode
step until the whole row leaves the batch (``safetyrepro.inference.decode``). No logit is read
there and no other position attends to it, so the decode loops have
``safetyrepro.inference.prefill.forward`` run each layer's feed-forward block on the running
streams' positions only (``safetyrepro.inference.decode.SKIP_UNREAD_FFN``). This times decode
groups (greedy + T=0.3 x 5 seeds + T=0.7 x 5 seeds, ``generate_streams``, as the worker runs
them) of the run's items on the model as the worker loads it, in two variants timed
ALTERNATELY in one process:

* every position: ``SKIP_UNREAD_FFN = False`` (the code before);
* running only:   ``SKIP_UNREAD_FFN = True`` (the shipped code).

Reports the seconds of each, the ratio, how many of the 11 x items sequences are
token-identical and the share of decode positions that were dummies. Writes
benchmarks/results/skip_ffn.json. Run: benchmarks/README.md.
"""

from __future__ import annotations

import sys

from safetyrepro.perf.args import decode_group_parser

# the slice's decode groups (bench_slice.py) for every model
DEFAULT_CASES = [f"{m}:{case}" for m in ("smollm2-135m", "qwen2.5-0.5b", "gemma3-270m")
                 for case in ("truthfulqa:T1:k0", "bbq:T4:k0", "xstest:T2:k5")]


def main(argv=None) -> int:
    args = decode_group_parser(__doc__, DEFAULT_CASES).parse_args(argv)

    from safetyrepro.perf.report import publish
    from safetyrepro.perf.workload import switch_comparison

    try:
        rows, records = switch_comparison(args.config, args.cases, args.rounds,
                                          "safetyrepro.inference.decode", "SKIP_UNREAD_FFN",
                                          {"every position": False, "running only": True})
    except FileNotFoundError as exc:  # the run's items are missing
        print(exc, file=sys.stderr)
        return 2
    for row, record in zip(rows, records):
        decode = record["decode"]["running only"]
        slots = sum(d["token_slots"] for d in decode)
        record["dummy_share"] = sum(d["dummy_slots"] for d in decode) / slots if slots else 0.0
        row.append(record["dummy_share"])
    publish("skip_ffn", ["model", "benchmark", "template-shots", "every position s (median)",
                         "running only s (median)", "speed-up", "identical sequences",
                         "dummy share of decode positions"], rows, {"records": records}, out_dir=args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
