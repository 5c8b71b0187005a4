"""Benchmark 1: candidate log-likelihood scoring, safetyrepro vs lm-evaluation-harness.

Same local model folder, same TruthfulQA MC1 items (drawn by the run's own subset rules),
same rendered chat contexts and candidate continuations, same token ids, same dtype and batch
size. Timed ALTERNATELY (ours, lm-eval, ours, lm-eval, ...):

* ours:    safetyrepro.inference.score_candidates (strings in; tokenisation included)
* lm-eval: lm_eval.models.huggingface.HFLM._loglikelihood_tokens on the identical
           (context ids, continuation ids) requests -- the method HFLM.loglikelihood calls
           after tokenising. Using the token ids directly keeps the scored tokens identical:
           HFLM.loglikelihood moves ALL trailing whitespace of the context (here the chat
           template's final newline) into the continuation, so on the raw strings it scores
           one extra token per candidate. That public path is also run once (on the models of
           --public-api-models) and reported: its time and its argmax agreement.

Prints a table and writes benchmarks/results/lmeval.json. Run: see benchmarks/README.md.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

from safetyrepro.perf.args import bench_parser


def main(argv=None) -> int:
    ap = bench_parser(__doc__)
    ap.add_argument("--models", nargs="+", default=["smollm2-135m", "qwen2.5-0.5b"])
    ap.add_argument("--cells", nargs="+", default=["T1-greedy-k0-logprob"],
                    help="logprob config ids whose prompts are used")
    ap.add_argument("--items", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3, help="timed runs of each side")
    ap.add_argument("--rounds-large", type=int, default=1,
                    help="rounds for models above 300M parameters (default 1: one lm-eval pass "
                         "over 100 items takes ~4 min for Qwen on one CPU thread)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (default 1: robust to background load on a shared box)")
    ap.add_argument("--public-api-models", nargs="*", default=["smollm2-135m"],
                    help="models on which the public HFLM.loglikelihood is also run once")
    ap.add_argument("--tol", type=float, default=2e-3, help="|loglik| agreement tolerance")
    ap.add_argument("--out", default=None, help="results folder (default benchmarks/results)")
    args = ap.parse_args(argv)

    import torch
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    from safetyrepro.config import load_config
    from safetyrepro.inference import encode_pair, score_candidates
    from safetyrepro.models import load_model
    from safetyrepro.perf.report import publish
    from safetyrepro.perf.timing import alternate
    from safetyrepro.perf.workload import load_workload, logprob_requests

    torch.set_num_threads(args.threads)
    load_start = [round(x, 2) for x in os.getloadavg()]
    cfg = load_config(args.config)
    wl = load_workload(cfg, "truthfulqa", args.items)
    print(f"# lm-eval comparison: {len(wl.items)} TruthfulQA items (subset {wl.subset_hash[:12]}), "
          f"{args.dtype}, batch size {args.batch_size}, {args.threads} thread(s)", flush=True)
    rows, records = [], []
    for key in args.models:
        lm = load_model(cfg, key, quantization=args.dtype, device="cpu")
        n_params = sum(p.numel() for p in lm.model.parameters())
        rounds = args.rounds_large if (args.rounds_large and n_params > 3e8) else args.rounds
        hf = HFLM(pretrained=lm.info["path"], device="cpu",
                  dtype="float32" if args.dtype == "fp32" else "bfloat16",
                  batch_size=args.batch_size)
        hf.model.eval()
        for cell in args.cells:
            contexts, cands = logprob_requests(cfg, lm, wl, cell)
            reqs, owner = [], []
            for i, (ctx, cs) in enumerate(zip(contexts, cands)):
                for j, c in enumerate(cs):
                    ci, co = encode_pair(lm.tokenizer, ctx, c)
                    reqs.append(((ctx, c), ci, co))
                    owner.append((i, j))
            n_tok_full = sum(len(ci) + len(co) - 1 for _, ci, co in reqs)
            cont_len = [len(co) for _, _, co in reqs]
            print(f"\n## {key} {cell}: {len(contexts)} items, {len(reqs)} candidates "
                  f"({sum(n > 1 for n in cont_len)} multi-token, mean {statistics.mean(cont_len):.1f} "
                  f"tokens), {rounds} round(s)", flush=True)

            def ours():
                return score_candidates(lm, contexts, cands, batch_size=args.batch_size)

            def theirs():
                return hf._loglikelihood_tokens(reqs, disable_tqdm=True)

            # warm-up (not timed): a few items each
            score_candidates(lm, contexts[:4], cands[:4], batch_size=args.batch_size)
            hf._loglikelihood_tokens(reqs[:8], disable_tqdm=True)
            timed = alternate({"safetyrepro": ours, "lm-eval": theirs}, rounds)
            mine, ref = timed.results["safetyrepro"], timed.results["lm-eval"]
            ref_items: list[list[float]] = [[] for _ in contexts]
            ref_greedy: list[list[bool]] = [[] for _ in contexts]
            for (i, j), (ll, greedy) in zip(owner, ref):
                ref_items[i].append(float(ll))
                ref_greedy[i].append(bool(greedy))
            diffs = [abs(s.loglik - r) for ms, rs in zip(mine, ref_items) for s, r in zip(ms, rs)]
            argmax_same = sum(
                max(range(len(ms)), key=lambda j: ms[j].loglik) == max(range(len(rs)), key=rs.__getitem__)
                for ms, rs in zip(mine, ref_items))
            greedy_same = sum(s.is_greedy == g for ms, gs in zip(mine, ref_greedy) for s, g in zip(ms, gs))
            rec = {
                "model": key, "cell": cell, "dtype": args.dtype, "batch_size": args.batch_size,
                "n_items": len(contexts), "n_candidates": len(reqs),
                "multi_token_candidates": sum(n > 1 for n in cont_len),
                "mean_candidate_tokens": statistics.mean(cont_len),
                "tokens_per_full_sequence_total": n_tok_full,
                "rounds": rounds, "times_s": timed.times,
                "median_s": {k: timed.median(k) for k in timed.times},
                "ratio": timed.ratio("lm-eval", "safetyrepro"),
                "paired_ratios": timed.paired_ratios("lm-eval", "safetyrepro"),
                "argmax_identical": argmax_same, "max_abs_loglik_diff": max(diffs),
                "within_tol": sum(d <= args.tol for d in diffs), "tol": args.tol,
                "is_greedy_identical": greedy_same,
            }
            if key in args.public_api_models:
                inst = [Instance(request_type="loglikelihood", doc={}, arguments=(ctx, c), idx=k)
                        for k, ((ctx, c), _, _) in enumerate(reqs)]
                t0 = time.perf_counter()
                pub = hf.loglikelihood(inst, disable_tqdm=True)
                t_pub = time.perf_counter() - t0
                pub_items: list[list[float]] = [[] for _ in contexts]
                for (i, j), (ll, _) in zip(owner, pub):
                    pub_items[i].append(float(ll))
                pub_same = sum(max(range(len(ms)), key=lambda j: ms[j].loglik) ==
                               max(range(len(ps)), key=ps.__getitem__)
                               for ms, ps in zip(mine, pub_items))
                # the extra token (the moved newline) adds the same term to every candidate
                spread = max(max(d) - min(d) for d in
                             ([p - s.loglik for s, p in zip(ms, ps)] for ms, ps in zip(mine, pub_items)))
                rec["public_api"] = {"seconds": t_pub, "ratio_vs_ours_median": t_pub / timed.median("safetyrepro"),
                                     "argmax_identical": pub_same,
                                     "max_within_item_offset_spread": spread}
                print(f"  public HFLM.loglikelihood once: {t_pub:.2f} s; argmax identical "
                      f"{pub_same}/{len(contexts)}", flush=True)
            records.append(rec)
            rows.append([key, cell, f"{len(contexts)} / {len(reqs)}", f"{rec['mean_candidate_tokens']:.1f}",
                         rounds, timed.median("safetyrepro"), timed.median("lm-eval"),
                         f"{rec['ratio']:.2f}x",
                         f"{min(rec['paired_ratios']):.2f}-{max(rec['paired_ratios']):.2f}",
                         f"{argmax_same}/{len(contexts)}", f"{max(diffs):.1e}"])
        del hf, lm
    publish("lmeval", ["model", "cell", "items / cands", "cand tok", "rounds", "ours s (median)",
                       "lm-eval s (median)", "speed-up", "paired range", "argmax same", "max |dLL|"],
            rows, {"records": records, "threads": args.threads, "loadavg_start": load_start},
            out_dir=args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
