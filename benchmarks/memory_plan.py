"""What the generation memory planner (``safetyrepro.inference.memory``) expects to fit on
24, 40, 48 and 80 GB cards for the paper's three models in NF4: an ESTIMATE from the footprint
model, computed on a CPU; no GPU was used and nothing here is a measurement.

Model dimensions are those of the models' published ``config.json`` files; NF4 weights are
estimated as 0.516 bytes per linear-layer parameter (4 bits plus bitsandbytes' double-quantised
block scales, block size 64) with the embeddings and output projection kept in bf16. The
prompt lengths are assumptions (a five-shot prompt's shared prefix and its longest item
suffix), stated in the record. Writes benchmarks/results/memory_plan.json and prints the
markdown table of docs/GPU_MEMORY.md.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from safetyrepro.inference.memory import MemoryBudget, ModelDims, generation_footprint, max_rows

GIB = 1 << 30
# name: (layers, hidden, intermediate, q heads, kv heads, head dim, vocab, tied embeddings)
MODELS = {
    "Qwen2.5-7B-Instruct": (28, 3584, 18944, 28, 4, 128, 152064, False),
    "Mistral-7B-Instruct-v0.3": (32, 4096, 14336, 32, 8, 128, 32768, False),
    "Yi-1.5-9B-Chat": (48, 4096, 11008, 32, 4, 128, 64000, False),
}
CARDS_GB = (24, 40, 48, 80)
# (what, streams, max_new_tokens, shared prefix tokens, longest item suffix tokens)
GROUPS = [
    ("T4 five-shot decode group (11 streams x 256)", 11, 256, 1200, 300),
    ("T1-T3 five-shot decode group (11 streams x 16)", 11, 16, 900, 300),
    ("XSTest T1-T3 zero-shot (11 streams x 128)", 11, 128, 100, 120),
]
CAP = 32            # generation.batch_size of config/paper.yaml
STORE = 2 * GIB     # runtime.prefill_store_mb default


def dims(layers, hidden, inter, qh, kvh, hd, vocab, tied) -> ModelDims:
    linear = layers * (2 * hidden * qh * hd + 2 * hidden * kvh * hd + 3 * hidden * inter)
    embed = vocab * hidden * (1 if tied else 2)
    weights = int(linear * 0.516 + embed * 2)
    return ModelDims(layers, hidden, inter, qh, kvh, hd, vocab, act_bytes=2, weight_bytes=weights)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="benchmarks/results/memory_plan.json")
    args = ap.parse_args(argv)
    rows = []
    for name, spec in MODELS.items():
        d = dims(*spec)
        for what, k, t, prefix, width in GROUPS:
            for gb in CARDS_GB:
                budget = MemoryBudget(gb * GIB, d.weight_bytes, STORE)

                def fp(r):
                    return generation_footprint(d, rows=r, width=width, prefix=prefix, detached=False,
                                                streams=k, max_new_tokens=t, columns=True,
                                                grouped=True)
                n = max_rows(fp, budget.budget_bytes, CAP)
                rows.append({"model": name, "group": what, "card_gib": gb, "streams": k,
                             "max_new_tokens": t, "prefix_tokens": prefix, "suffix_tokens": width,
                             "weights_gib": round(d.weight_bytes / GIB, 2),
                             "budget_gib": round(budget.budget_bytes / GIB, 2),
                             "prompts_per_batch": n,
                             "footprint_gib_at_cap": round(fp(CAP) / GIB, 2),
                             "footprint_gib_at_plan": round(fp(n) / GIB, 2) if n else None})
    record = {"kind": "estimate", "gpu_used": False, "cap": CAP, "store_bytes": STORE,
              "note": "footprint model of safetyrepro.inference.memory; not a measurement",
              "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    print("| model | decode group | " + " | ".join(f"{g} GB" for g in CARDS_GB)
          + " | footprint of 32 prompts |")
    print("|---|---|" + "---|" * len(CARDS_GB) + "---|")
    for name in MODELS:
        for what, *_ in GROUPS:
            sel = [r for r in rows if r["model"] == name and r["group"] == what]
            cells = [str(r["prompts_per_batch"]) if r["prompts_per_batch"] else "does not fit"
                     for r in sel]
            print(f"| {name} ({sel[0]['weights_gib']} GiB NF4) | {what} | " + " | ".join(cells)
                  + f" | {sel[0]['footprint_gib_at_cap']} GiB |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
