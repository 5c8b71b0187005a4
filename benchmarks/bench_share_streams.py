"""Benchmark 21: streams with equal tokens so far decoding as one column.

A decode group's greedy stream and its low-temperature samples often produce the same tokens
for a while (the default run's shards: about half of all decode positions repeat another
stream's history). ``safetyrepro.inference.decode.decode_stream_columns`` feeds one column per
distinct history and lets each stream sample the shared logits with its own generator
(``SHARE_EQUAL_STREAMS``). This times decode groups (greedy + T=0.3 x 5 seeds + T=0.7 x 5
seeds, ``generate_streams``, as the worker runs them) of the run's items on the model as the
worker loads it, in two variants timed ALTERNATELY in one process:

* own column: ``SHARE_EQUAL_STREAMS = False`` (one column per running stream);
* shared:     ``SHARE_EQUAL_STREAMS = True`` (the shipped code).

Reports the seconds of each, the ratio, how many of the 11 x items sequences are
token-identical and the share of decode tokens that took another stream's column. Writes
benchmarks/results/share_streams.json. Run: benchmarks/README.md.
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
                                          "safetyrepro.inference.decode", "SHARE_EQUAL_STREAMS",
                                          {"own column": False, "shared": True})
    except FileNotFoundError as exc:  # the run's items are missing
        print(exc, file=sys.stderr)
        return 2
    for row, record in zip(rows, records):
        decode = record["decode"]["shared"]
        tokens = sum(d["tokens"] for d in decode)
        record["shared_share"] = sum(d["shared_tokens"] for d in decode) / tokens if tokens else 0.0
        row.append(record["shared_share"])
    publish("share_streams", ["model", "benchmark", "template-shots", "own column s (median)",
                              "shared s (median)", "speed-up", "identical sequences",
                              "shared share of decode tokens"], rows, {"records": records},
            out_dir=args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
