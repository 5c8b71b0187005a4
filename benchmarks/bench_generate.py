"""Benchmark 2: free-form generation, the engine's batched path vs one ``generate`` call per item.

Same model object, same prompts (free-form prompts of real cells, items drawn by the run's
subset rules), same greedy settings and stop tokens. Two default settings: the default
config's TruthfulQA T1 five-shot cell at its max_new_tokens (8; the answer is a letter, so the
work is mostly the ~700-token prompts) and the chain-of-thought template T4 (zero-shot) at 32
new tokens (decoding-heavy). Timed ALTERNATELY per setting:

* ours:  safetyrepro.inference.generate(lm, prompts, batch_size=16, temperature=0): length-sorted
         batches, the prompts' shared token prefix (system text + few-shot exemplars) prefilled
         once, explicit decode loop with finished rows leaving the batch;
* naive: for each prompt, ``lm.model.generate(ids, do_sample=False, max_new_tokens=N)`` with the
         same end-of-turn ids (transformers' own greedy search, batch size 1).

Checks that the generated token ids are identical item by item. Prints a table and writes
benchmarks/results/generate.json. Run: see benchmarks/README.md.
"""

from __future__ import annotations

import os
import statistics
import sys

from safetyrepro.perf.args import add_generation_args, bench_parser


def main(argv=None) -> int:
    ap = bench_parser(__doc__)
    ap.add_argument("--models", nargs="+", default=["smollm2-135m"])
    ap.add_argument("--benchmark", default="truthfulqa")
    ap.add_argument("--settings", nargs="+", default=["T1-greedy-k5-freeform:8", "T4-greedy-k0-freeform:32"],
                    help="CELL:MAX_NEW_TOKENS pairs (free-form config ids)")
    ap.add_argument("--items", type=int, default=100)
    args = add_generation_args(ap).parse_args(argv)

    import torch

    from safetyrepro.config import load_config
    from safetyrepro.inference import encode_prompt, generate
    from safetyrepro.models import load_model
    from safetyrepro.perf.report import publish
    from safetyrepro.perf.timing import alternate
    from safetyrepro.perf.workload import freeform_prompts, load_workload

    torch.set_num_threads(args.threads)
    load_start = [round(x, 2) for x in os.getloadavg()]
    cfg = load_config(args.config)
    wl = load_workload(cfg, args.benchmark, args.items)
    settings = [(c, int(n)) for c, n in (x.rsplit(":", 1) for x in args.settings)]
    print(f"# generation: {len(wl.items)} {args.benchmark} items, {args.dtype}, "
          f"batch size {args.batch_size}, {args.threads} thread(s)", flush=True)
    rows, records = [], []
    for key in args.models:
        lm = load_model(cfg, key, quantization=args.dtype, device="cpu")
        for cell, n_new in settings:
            prompts = freeform_prompts(cfg, lm, wl, cell)
            enc = [encode_prompt(lm.tokenizer, p) for p in prompts]
            n_prompt = [len(e) for e in enc]
            print(f"\n## {key} {cell}: max_new_tokens {n_new}, prompts "
                  f"{statistics.mean(n_prompt):.0f} tokens on average", flush=True)

            def ours(prompts=prompts, n_new=n_new):
                return generate(lm, prompts, max_new_tokens=n_new, temperature=0,
                                batch_size=args.batch_size)

            def naive(enc=enc, n_new=n_new):
                out = []
                with torch.inference_mode():
                    for e in enc:
                        ids = torch.tensor([e], device=lm.device)
                        gen = lm.model.generate(ids, attention_mask=torch.ones_like(ids),
                                                do_sample=False, max_new_tokens=n_new,
                                                eos_token_id=lm.stop_ids,
                                                pad_token_id=lm.tokenizer.pad_token_id)
                        out.append(gen[0, ids.shape[1]:].tolist())
                return out

            generate(lm, prompts[:2], max_new_tokens=2, temperature=0)  # warm-up
            timed = alternate({"safetyrepro": ours, "naive generate": naive}, args.rounds)
            mine, ref = timed.results["safetyrepro"], timed.results["naive generate"]
            same = sum(g.token_ids == r for g, r in zip(mine, ref))
            n_gen = [g.n_gen_tokens for g in mine]
            rec = {"model": key, "dtype": args.dtype, "cell": cell, "n_items": len(prompts),
                   "max_new_tokens": n_new, "batch_size": args.batch_size,
                   "mean_prompt_tokens": statistics.mean(n_prompt),
                   "mean_generated_tokens": statistics.mean(n_gen),
                   "times_s": timed.times,
                   "median_s": {k: timed.median(k) for k in timed.times},
                   "ratio": timed.ratio("naive generate", "safetyrepro"),
                   "paired_ratios": timed.paired_ratios("naive generate", "safetyrepro"),
                   "identical_outputs": same}
            records.append(rec)
            rows.append([key, cell, n_new, len(prompts), f"{statistics.mean(n_prompt):.0f}",
                         f"{statistics.mean(n_gen):.1f}", args.rounds,
                         timed.median("safetyrepro"), timed.median("naive generate"),
                         f"{rec['ratio']:.2f}x", f"{same}/{len(prompts)}"])
        del lm
    publish("generate", ["model", "cell", "max new", "items", "prompt tok", "gen tok", "rounds",
                         "ours s", "naive s", "speed-up", "identical"], rows,
            {"records": records, "threads": args.threads, "loadavg_start": load_start}, out_dir=args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
