"""Benchmark 7: a free-form config's decode group in one batch vs its decodings one by one.

The greedy, T=0.3 and T=0.7 cells of one (benchmark, template, shots) render the same prompts
(``Plan.decode_group``). Two ways to compute their 11 sequences per item (1 greedy + 2 x 5
seeds), on the same loaded model (as the worker loads it), the same prompts of the run's
items and the same settings, timed ALTERNATELY:

* separate: ``generate`` (greedy) then ``generate_multi_seed`` at T=0.3 and at T=0.7, sharing one
  fresh ``PrefillStore`` (how the worker computed them before decode groups);
* group:    one ``generate_streams`` call with the 11 streams (how the worker computes them now).

Reports per (model, benchmark, template, shots) the seconds of each round, the ratio of the
sums and how many of the 11 x items sequences are token-identical (bf16/NF4: a batch of
different composition can flip a token; in fp32 they are equal, see the tests). Writes
benchmarks/results/decode_groups.json. Run: benchmarks/README.md.
"""

from __future__ import annotations

import sys

from safetyrepro.perf.args import decode_group_parser

DEFAULT_CASES = ["qwen2.5-0.5b:truthfulqa:T4:k5", "smollm2-135m:truthfulqa:T4:k3",
                 "gemma3-270m:truthfulqa:T4:k0", "gemma3-270m:bbq:T4:k5", "qwen2.5-0.5b:bbq:T1:k3"]


def main(argv=None) -> int:
    args = decode_group_parser(__doc__, DEFAULT_CASES).parse_args(argv)

    from safetyrepro.inference import generate, generate_multi_seed, generate_streams
    from safetyrepro.inference.store import PrefillStore
    from safetyrepro.perf.report import publish
    from safetyrepro.perf.timing import alternate
    from safetyrepro.perf.workload import group_cases, group_comparison

    rows, records = [], []
    try:
        for (model, bench, template, shots), lm, gc in group_cases(args.config, args.cases):
            prompts, group, levels, kw = gc.prompts, gc.group, gc.levels, gc.kw

            def separate():
                store, out = PrefillStore(), []
                for d, n in group:
                    lv = levels[d]
                    if lv["sampled"]:
                        by_seed = generate_multi_seed(lm, prompts, list(range(n)), temperature=lv["temperature"],
                                                      top_p=lv.get("top_p", 1.0), store=store, **kw)
                        out.extend(by_seed[s] for s in range(n))
                    else:
                        out.append(generate(lm, prompts, temperature=0, store=store, **kw))
                return out

            def grouped():
                return generate_streams(lm, prompts, gc.streams, store=PrefillStore(), **kw)

            timed = alternate({"separate": separate, "group": grouped}, args.rounds)
            row, record = group_comparison((model, bench, template, shots), lm, gc, timed, "separate", "group")
            rows.append(row)
            records.append(record)
    except FileNotFoundError as exc:  # the run's items are missing
        print(exc, file=sys.stderr)
        return 2
    publish("decode_groups", ["model", "benchmark", "template-shots", "separate s (median)", "group s (median)",
                              "speed-up", "identical sequences"], rows, {"records": records}, out_dir=args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
