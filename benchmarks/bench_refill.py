"""A decode group batch by batch (today's path before the refill) against the same group as a
continuous batch (finished prompts' cache rows refilled from the queue), on the embedded
SmolLM2-135M on a CPU: wall time, decode forwards, token slots fed and dummy slots, and whether
every sequence's tokens are equal. Writes benchmarks/results/refill.json.

On a CPU a decode step's cost grows with the token slots it feeds, so fewer forwards save
little here; on a GPU, where a decode step reads the weights once whatever its rows, the
forwards are what the refill saves. This records both; it is not a GPU measurement."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

QUESTIONS = ["What is the capital of France?", "Is it safe to eat raw chicken? Answer yes or no.",
             "Name a color.", "Write one word: hello", "Who wrote Romeo and Juliet?",
             "What happens if you swallow gum?", "Count to three.", "Say hi.",
             "Explain in two sentences why the sky is blue.", "Is 17 a prime number?",
             "Give a synonym of happy.", "Describe a cat in one sentence."]


def main(argv=None) -> int:
    from safetyrepro.config import load_config
    from safetyrepro.inference import Stream, generate_streams
    from safetyrepro.inference.batching import BatchRecord
    from safetyrepro.models import format_prompt, load_model

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="benchmarks/results/refill.json")
    ap.add_argument("--quantization", default="fp32")
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--batch-size", type=int, default=4)
    args = ap.parse_args(argv)
    cfg = load_config(Path(__file__).resolve().parents[1] / "config" / "config.yaml")
    lm = load_model(cfg, "smollm2-135m", quantization=args.quantization, device="cpu")
    prompts = [format_prompt(lm.tokenizer, [{"role": "system", "content": "Answer briefly."},
                                            {"role": "user", "content": q}]) for q in QUESTIONS]
    # greedy + T=0.3 x 5 seeds (a decode group's greedy and low-temperature streams)
    streams = [Stream(0.0)] + [Stream(0.3, 1.0, s) for s in range(5)]
    runs, outs = {}, {}
    for refill in (False, True):
        rec = BatchRecord()
        t = time.perf_counter()
        outs[refill] = generate_streams(lm, prompts, streams, max_new_tokens=args.max_new_tokens,
                                        batch_size=args.batch_size, refill=refill, record=rec)
        runs["refill" if refill else "batch_by_batch"] = {
            "wall_s": round(time.perf_counter() - t, 2), **rec.decode[0]}
    equal = sum(a.token_ids == b.token_ids for x, y in zip(outs[False], outs[True])
                for a, b in zip(x, y))
    record = {"model": "smollm2-135m", "quantization": args.quantization, "device": "cpu",
              "attention": lm.info["attention"], "prompts": len(prompts), "streams": len(streams),
              "max_new_tokens": args.max_new_tokens, "batch_size": args.batch_size,
              "sequences_equal": equal, "sequences": len(prompts) * len(streams), **runs}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
