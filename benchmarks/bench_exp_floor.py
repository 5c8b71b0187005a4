"""Benchmark 8: the sampler's exponent floor (no subnormal floats) on whole decode groups.

``safetyrepro.inference.sampling._Sampler._draw_rows`` clamps each row's shifted, scaled logits
at ``EXP_FLOOR`` (-87) before ``exp_``: below that the float32 result is subnormal, which x86
CPUs compute ~75x slower. This times one decode group (greedy + T=0.3 x 5 seeds + T=0.7 x 5
seeds, ``generate_streams``, as the worker runs it) of a (model, benchmark, template, shots)
on the loaded model (as the worker loads it), the run's items and the default settings, in
two variants timed ALTERNATELY in one process:

* unclamped: ``EXP_FLOOR = -inf`` (a no-op clamp: the code before the floor);
* floor:     ``EXP_FLOOR = -87`` (the shipped code).

Reports the seconds of each, the ratio and how many of the 11 x items sequences are
token-identical (the floor changes weights below 1.2e-38 of the top token only, so all should
be). Writes benchmarks/results/exp_floor.json. Run: benchmarks/README.md.
"""

from __future__ import annotations

import sys

from safetyrepro.perf.args import decode_group_parser

DEFAULT_CASES = ["gemma3-270m:truthfulqa:T4:k0", "qwen2.5-0.5b:truthfulqa:T4:k5",
                 "smollm2-135m:truthfulqa:T4:k3", "gemma3-270m:bbq:T1:k3"]


def main(argv=None) -> int:
    args = decode_group_parser(__doc__, DEFAULT_CASES).parse_args(argv)

    from safetyrepro.inference.sampling import EXP_FLOOR
    from safetyrepro.perf.report import publish
    from safetyrepro.perf.workload import switch_comparison

    try:
        rows, records = switch_comparison(args.config, args.cases, args.rounds,
                                          "safetyrepro.inference.sampling", "EXP_FLOOR",
                                          {"unclamped": float("-inf"), "floor": EXP_FLOOR})
    except FileNotFoundError as exc:  # the run's items are missing
        print(exc, file=sys.stderr)
        return 2
    publish("exp_floor", ["model", "benchmark", "template-shots", "unclamped s (median)", "floor s (median)",
                          "speed-up", "identical sequences"], rows, {"records": records}, out_dir=args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
