"""Benchmark 8: the sampler's exponent floor (no subnormal floats) on whole decode groups.

``safetyrepro.inference.generate._Sampler._draw_rows`` clamps each row's shifted, scaled logits
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

import argparse
import sys

DEFAULT_CASES = ["gemma3-270m:truthfulqa:T4:k0", "qwen2.5-0.5b:truthfulqa:T4:k5",
                 "smollm2-135m:truthfulqa:T4:k3", "gemma3-270m:bbq:T1:k3"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="config/config.yaml")
    ap.add_argument("--cases", nargs="+", default=DEFAULT_CASES, help="MODEL:BENCHMARK:TEMPLATE:SHOTS")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    from safetyrepro import cells
    from safetyrepro.config import load_config
    from safetyrepro.inference import Stream, generate_streams
    from safetyrepro.inference import generate as gen_mod
    from safetyrepro.inference.kvcache import PrefillStore
    from safetyrepro.models import format_prompt
    from safetyrepro.perf.report import publish
    from safetyrepro.perf.timing import alternate
    from safetyrepro.plan import Plan
    from safetyrepro.tasks import load_task

    shipped = gen_mod.EXP_FLOOR
    cfg = load_config(args.config)
    plan = Plan(cfg)
    rows, records, models = [], [], {}
    for case in args.cases:
        model, bench, template, shots = case.split(":")
        if not plan.items_path(bench).exists():
            print(f"{plan.items_path(bench)} is missing: run `safetyrepro items --config {args.config}` "
                  f"(or the workflow) first", file=sys.stderr)
            return 2
        if model not in models:
            models.clear()  # one model in memory at a time
            models[model] = cells.load_for_worker(config=args.config, model=model)
        lm = models[model]
        items, _ = cells._items(plan.items_path(bench))
        pool, _ = cells._items(plan.fewshot_path(bench))
        task = load_task(bench)
        n_shots = cfg.rules.level("shots", shots)["n"]
        prompts = [format_prompt(lm.tokenizer, task.build_messages(it, template, pool[:n_shots]))
                   for it in items]
        group = plan.decode_group(bench, f"{template}-greedy-{shots}-freeform")
        streams = []
        for d, n in group:
            lv = cfg.rules.level("decoding", d)
            streams += ([Stream(lv["temperature"], lv.get("top_p", 1.0), s) for s in range(n)]
                        if lv["sampled"] else [Stream(0.0, lv.get("top_p", 1.0), 0)])
        kw = dict(max_new_tokens=cfg.max_new_tokens(bench, template),
                  batch_size=cfg.data["generation"]["batch_size"])

        def run(floor):
            gen_mod.EXP_FLOOR = floor
            try:
                return generate_streams(lm, prompts, streams, store=PrefillStore(), **kw)
            finally:
                gen_mod.EXP_FLOOR = shipped

        timed = alternate({"unclamped": lambda: run(float("-inf")), "floor": lambda: run(shipped)},
                          args.rounds)
        a, b = timed.results["unclamped"], timed.results["floor"]
        same = sum(x.token_ids == y.token_ids for sa, sb in zip(a, b) for x, y in zip(sa, sb))
        total = sum(len(s) for s in a)
        ratio = timed.ratio("unclamped", "floor")
        rows.append([model, bench, f"{template}-{shots}", timed.median("unclamped"), timed.median("floor"),
                     f"{ratio:.2f}x", f"{same}/{total}"])
        records.append({"model": model, "benchmark": bench, "template": template, "shots": shots,
                        "group": [list(g) for g in group], "times_s": timed.times, "ratio": ratio,
                        "identical_sequences": same, "n_sequences": total, "exp_floor": shipped,
                        "model_info": {k: lm.info.get(k) for k in ("quantization", "nf4_matmul", "attention", "threads")}})
    publish("exp_floor", ["model", "benchmark", "template-shots", "unclamped s (median)", "floor s (median)",
                          "speed-up", "identical sequences"], rows, {"records": records}, out_dir=args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
