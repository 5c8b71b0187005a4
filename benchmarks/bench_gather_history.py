"""Benchmark 22: stream columns reading their own generated tokens as a dense list.

In a stream-column decode step every column's query used to score the whole generated block
of its row (every stream's tokens) and mask out all but its own history, one column per step:
with 11 streams about 10 of every 11 generated columns were scored for nothing. Where the
engine's attention runs, ``safetyrepro.inference.decode.decode_stream_columns`` now hands it
each column's history as cache column numbers (``safetyrepro.inference.attention
.stream_history``): the prompt columns under the mask, then exactly the history, gathered
(``GATHER_HISTORY``). This times decode groups (greedy + T=0.3 x 5 seeds + T=0.7 x 5 seeds,
``generate_streams``, as the worker runs them) of the run's items on the model as the worker
loads it, in two variants timed ALTERNATELY in one process:

* masked block: ``GATHER_HISTORY = False``;
* gathered:     ``GATHER_HISTORY = True`` (the shipped code).

Reports the seconds of each, the ratio and how many of the 11 x items sequences are
token-identical. Writes benchmarks/results/gather_history.json. Run: benchmarks/README.md.
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
                                          "safetyrepro.inference.decode", "GATHER_HISTORY",
                                          {"masked block": False, "gathered": True})
    except FileNotFoundError as exc:  # the run's items are missing
        print(exc, file=sys.stderr)
        return 2
    publish("gather_history", ["model", "benchmark", "template-shots", "masked block s (median)",
                               "gathered s (median)", "speed-up", "identical sequences"],
            rows, {"records": records}, out_dir=args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
