"""Benchmark 3: sampled cells, prefill reuse across seeds and across items.

A sampled cell runs the same prompts under several seeds (5 in the default envelope). The
engine prefills each prompt ONCE and decodes every seed from a fork of that cache
(``generate_multi_seed``; the cell runner asks for all seeds of a config in one call), and it
prefills the token prefix shared by all prompts of the call (system text, few-shot
exemplars) once (``prefix_cache``). Four variants, same prompts/seeds/settings, timed
alternately:

* recompute everything:   one ``generate(seed=s, prefix_cache=False)`` per seed
* shared prefix only:     one ``generate(seed=s)`` per seed
* seeds share the prefill: ``generate_multi_seed(seeds, prefix_cache=False)``
* both (what cells run):  ``generate_multi_seed(seeds)``

The two multi-seed variants decode with the repeated-rows layout (``stream_columns=False``), as
the per-seed variants do, so the comparison isolates the prefill; decoding a prompt's seeds
as columns of one cache row (what cells now run on long prompts) is benchmark 3b,
``bench_seed_columns.py``.

Reports the prompt positions run through the model (prefill forwards, padding included) and
the decode row-steps (both counted by a forward hook), wall time and the ratios to
"recompute everything", and checks that all variants give identical outputs for every seed. Writes benchmarks/results/seeds.json. Run: see benchmarks/README.md.
"""

from __future__ import annotations

import os
import sys

from safetyrepro.perf.args import add_generation_args, bench_parser


def main(argv=None) -> int:
    ap = bench_parser(__doc__)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--benchmark", default="truthfulqa")
    ap.add_argument("--cell", default="T1-t0.7-k5-freeform", help="a sampled free-form config id")
    ap.add_argument("--items", type=int, default=12, help="default: the default config's cell size")
    ap.add_argument("--max-new-tokens", type=int, default=None,
                    help="default: the run config's value for the cell's template")
    args = add_generation_args(ap).parse_args(argv)

    import torch

    from safetyrepro.config import load_config
    from safetyrepro.grid import Config
    from safetyrepro.inference import generate, generate_multi_seed
    from safetyrepro.models import load_model
    from safetyrepro.perf.report import publish
    from safetyrepro.perf.timing import alternate
    from safetyrepro.perf.workload import freeform_prompts, load_workload

    torch.set_num_threads(args.threads)
    load_start = [round(x, 2) for x in os.getloadavg()]
    cfg = load_config(args.config)
    c = Config.parse(args.cell)
    dec = cfg.rules.level("decoding", c.decoding)
    if not dec["sampled"]:
        raise SystemExit(f"{args.cell} is not a sampled config")
    seeds = list(range(cfg.n_seeds(c.decoding)))
    n_new = args.max_new_tokens or cfg.max_new_tokens(args.benchmark, c.template)
    kw = dict(max_new_tokens=n_new, temperature=dec["temperature"], top_p=dec.get("top_p", 1.0),
              batch_size=args.batch_size)
    wl = load_workload(cfg, args.benchmark, args.items)
    lm = load_model(cfg, args.model, quantization=args.dtype, device="cpu")
    prompts = freeform_prompts(cfg, lm, wl, args.cell)
    print(f"# seeds: {args.model} {args.dtype}, {len(prompts)} {args.benchmark} items ({args.cell}), "
          f"{len(seeds)} seeds, max_new_tokens {n_new}, {args.threads} thread(s)", flush=True)

    counts = {"prefill": 0, "decode": 0}

    def count(_mod, _args, kwargs):
        ids = kwargs.get("input_ids")
        if ids is not None:
            if ids.shape[1] > 1:
                counts["prefill"] += ids.numel()
            else:
                counts["decode"] += ids.numel()

    def per_seed(prefix):
        return lambda: {s: generate(lm, prompts, seed=s, prefix_cache=prefix, **kw) for s in seeds}

    def multi(prefix):
        # repeated-rows decode layout, as in the per-seed variants, so that only the prefill
        # differs (seed columns change the decode layout; bench_seed_columns.py measures them)
        return lambda: generate_multi_seed(lm, prompts, seeds, prefix_cache=prefix,
                                           stream_columns=False, **kw)

    variants = {"recompute everything": per_seed(False), "shared prefix only": per_seed(True),
                "seeds share the prefill": multi(False), "both (cells)": multi(True)}
    # token counts: a forward hook counts what every timed run feeds the model
    tokens = {name: {"prefill": 0, "decode": 0} for name in variants}

    def counted(name, fn):
        def run():
            counts.update(prefill=0, decode=0)
            out = fn()
            tokens[name] = dict(counts)
            return out
        return run

    hook = lm.model.register_forward_pre_hook(count, with_kwargs=True)
    try:
        timed = alternate({k: counted(k, f) for k, f in variants.items()}, args.rounds)
    finally:
        hook.remove()
    ref = timed.results["recompute everything"]
    ident = {name: all([g.token_ids for g in res[s]] == [g.token_ids for g in ref[s]] for s in seeds)
             for name, res in timed.results.items()}
    distinct = len({tuple(tuple(g.token_ids) for g in ref[s]) for s in seeds})
    base = timed.median("recompute everything")
    rows = [[name, tokens[name]["prefill"], tokens[name]["decode"], timed.median(name),
             f"{base / timed.median(name):.2f}x",
             f"{tokens['recompute everything']['prefill'] / tokens[name]['prefill']:.2f}x",
             "yes" if ident[name] else "NO"] for name in variants]
    publish("seeds", ["variant", "prompt positions run", "decode row-steps", "seconds (median)",
                      "speed-up", "prefill saved", "outputs identical"], rows,
            {"model": args.model, "dtype": args.dtype, "cell": args.cell, "n_items": len(prompts),
             "seeds": seeds, "max_new_tokens": n_new, "tokens": tokens, "times_s": timed.times,
             "median_s": {k: timed.median(k) for k in timed.times}, "identical": ident,
             "distinct_seed_outputs": distinct, "threads": args.threads, "loadavg_start": load_start},
            out_dir=args.out, note=f"{distinct} distinct outputs over {len(seeds)} seeds (sampling is live)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
