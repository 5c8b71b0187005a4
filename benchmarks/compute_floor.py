"""Benchmark 22: the least time a finished run's arithmetic can take on this CPU.

Question: how far below a run's measured cell compute could any exact engine go here? Not a
comparison of two implementations: a lower bound from the run's own work.

From a finished run's shards (``--results``), per model and variant (main, bf16 check):

* every token sequence the model must be fed: each free-form prompt and, per stream, its
  generated tokens but the last (the engine's own tokenisation, :mod:`safetyrepro.inference.
  encoding`; generated text re-tokenised, cut to the shard's ``n_gen_tokens``), and each
  logprob context with each candidate but its last token (the requests rebuilt as the cells
  build them, :func:`safetyrepro.requests.cell_requests`, checked against the shard's
  stored contexts);
* ``positions``: the nodes of one token trie over all of them, i.e. the forward positions an
  engine must compute if it shared every equal prefix across items, cells and streams (the
  engine shares less: a prefix per call, equal histories within a decode group);
* ``logit_positions``: the nodes whose next-token distribution is read (a prompt's last token,
  every fed generated token, a context's last token and every candidate token but the last);
* FLOPs = 2 x (decoder linear weights) per position + 2 x (output projection) per logit
  position, from the model's safetensors header; attention, norms and the sampler are left
  out, so the bound stays below what any engine needs;
* ``rate``: the best GFLOP/s of ``torch.mm`` at the model's own weight shapes (rows 64 / 256 /
  1,024) in the run's compute dtype, on this machine, best of ``--reps``;
* ``floor_s`` = FLOPs / rate, against the run's cell seconds (the shards' ``wall_s``).

    .venv/bin/python benchmarks/compute_floor.py --results results [--config config/config.yaml]

Writes ``benchmarks/results/compute_floor.json`` (``--out``). Name the machine: the rate is
this CPU's, the run's seconds are the run's machine's (``--run-machine``).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import struct
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

SHARD_ROOTS = {"main": "shards", "bf16": "shards_bf16"}


class Trie:
    """Token trie counting its nodes and the nodes whose logits are read."""

    def __init__(self):
        self.root: dict = {}
        self.nodes = 0
        self.logit_nodes: set[int] = set()

    def feed(self, tokens: list[int], logits_from: int) -> None:
        """Insert ``tokens``; the nodes at depth >= ``logits_from`` (1-based) have their logits
        read."""
        node = self.root
        for depth, t in enumerate(tokens, 1):
            nxt = node.get(t)
            if nxt is None:
                nxt = node[t] = {}
                self.nodes += 1
            if depth >= logits_from:
                self.logit_nodes.add(id(nxt))
            node = nxt


def linear_shapes(model_dir: Path) -> tuple[list[tuple[int, int]], tuple[int, int]]:
    """``(decoder linear weight shapes, output projection shape)`` from the safetensors
    header(s) of a prepared model folder; the tied embedding serves as the output projection
    where there is no ``lm_head``."""
    shapes: dict[str, list[int]] = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        shapes.update({k: v["shape"] for k, v in header.items() if k != "__metadata__"})
    body = [tuple(s) for k, s in shapes.items()
            if ".layers." in k and k.endswith(".weight") and len(s) == 2]
    head = next((tuple(s) for k, s in shapes.items() if k.endswith("lm_head.weight")), None)
    if head is None:
        head = next(tuple(s) for k, s in shapes.items() if k.endswith("embed_tokens.weight"))
    return body, head


def best_rate(shapes: list[tuple[int, int]], dtype: str, reps: int) -> dict:
    """Best GFLOP/s of ``x @ W.T`` over the distinct weight shapes and 64 / 256 / 1,024 rows."""
    import torch

    dt = {"bfloat16": torch.bfloat16, "float32": torch.float32}[dtype]
    best = {"gflops": 0.0}
    with torch.inference_mode():
        for out_f, in_f in sorted(set(shapes)):
            w = torch.randn(out_f, in_f).to(dt)
            for m in (64, 256, 1024):
                x = torch.randn(m, in_f).to(dt)
                torch.mm(x, w.t())
                for _ in range(reps):
                    t = time.perf_counter()
                    torch.mm(x, w.t())
                    dt_s = time.perf_counter() - t
                    g = 2 * m * in_f * out_f / dt_s / 1e9
                    if g > best["gflops"]:
                        best = {"gflops": round(g, 1), "shape": [m, in_f, out_f]}
    return best


def load_shards(results: Path, variant: str):
    """``(metadata dict, columns)`` of every shard of ``variant``, read and checked as the
    workflow reads them (:func:`safetyrepro.shards.read_shard`)."""
    from safetyrepro.shards import read_shard

    for f in sorted((results / SHARD_ROOTS[variant]).glob("*/*/*/*.parquet")):
        table, meta = read_shard(f)
        yield meta.as_dict(), table.to_pydict()


def count_work(cfg, results: Path, variant: str, tokenizers: dict) -> tuple[dict, dict]:
    """Per model: the counts (trie positions, checks, the shards' seconds) and what the shards
    say it ran as (``{"path": model folder, "dtypes": compute dtypes}``)."""
    from safetyrepro.grid import config_of
    from safetyrepro.inference.encoding import encode_continuation, encode_prompt, split_trailing_space
    from safetyrepro.items.build import read_items
    from safetyrepro.requests import cell_requests
    from safetyrepro.tasks import load_task

    tries: dict[str, Trie] = collections.defaultdict(Trie)
    out: dict[str, dict] = collections.defaultdict(lambda: collections.Counter())
    ran: dict[str, dict] = {}
    items_cache: dict = {}
    for meta, rows in load_shards(results, variant):
        model = meta["model"]
        if model not in tokenizers:
            tokenizers[model] = _tokenizer(meta["model_info"]["path"])
        tok = tokenizers[model]
        trie, o = tries[model], out[model]
        o["cells"] += 1
        o["cell_seconds"] += meta["wall_s"]
        r = ran.setdefault(model, {"path": meta["model_info"]["path"], "dtypes": set()})
        r["dtypes"].add(meta["model_info"]["compute_dtype"])
        if meta["scoring"] == "freeform":
            for prompt, text, n_gen in zip(rows["prompt"], rows["raw_output"], rows["n_gen_tokens"]):
                p = encode_prompt(tok, prompt)
                g = encode_continuation(tok, text)
                o["gen_tokens"] += n_gen
                o["retokenised_differs"] += len(g) != n_gen
                fed = g[: max(n_gen - 1, 0)]
                trie.feed(p + fed, logits_from=len(p))
            continue
        bench = meta["benchmark"]
        if bench not in items_cache:
            folder = results / "items"
            items_cache[bench] = (read_items(folder / f"{bench}.parquet")[0].to_dict(orient="records"),
                                  read_items(folder / f"{bench}.fewshot.parquet")[0].to_dict(orient="records"))
        items, pool = items_cache[bench]
        by_id = {it["item_id"]: it for it in items}
        shard_items = [by_id[i] for i in rows["item_id"]]
        req = cell_requests(cfg, tok, load_task(bench), config_of(cfg.rules, meta["cell"]), shard_items, pool)
        o["contexts_differ"] += sum(a != b for a, b in zip(req.contexts, rows["prompt"]))
        for ctx, cands in zip(req.contexts, req.candidates):
            for cand in cands:
                c, rest = split_trailing_space(ctx, cand)
                ids, cont = encode_prompt(tok, c), encode_continuation(tok, rest)
                trie.feed(ids + cont[:-1], logits_from=len(ids))
    for model, trie in tries.items():
        out[model]["positions"] = trie.nodes
        out[model]["logit_positions"] = len(trie.logit_nodes)
    return {m: dict(v) for m, v in out.items()}, ran


def _tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, required=True, help="a finished run's results folder")
    ap.add_argument("--config", type=Path, default=None,
                    help="its run config (default: config/config.yaml beside --results)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dtype", choices=("bfloat16", "float32"), default=None,
                    help="rate the same work in this dtype instead of the run's (e.g. float32 "
                         "with ONEDNN_MAX_CPU_ISA=AVX2: a CPU without native bf16)")
    ap.add_argument("--run-machine", default=None, help="the machine the run's seconds come from")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "compute_floor.json")
    args = ap.parse_args(argv)

    from safetyrepro.config import load_config
    from safetyrepro.perf.machine import machine_info

    config = args.config or args.results.parent / "config" / "config.yaml"
    cfg = load_config(config)
    tokenizers: dict = {}
    record = {"benchmark": "22 (compute floor of a finished run)", "command": " ".join(sys.argv),
              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": machine_info(),
              "run_machine": args.run_machine, "results": str(args.results.resolve()),
              "config": str(config), "rated_dtype": args.dtype or "the run's",
              "env_caps": {k: os.environ[k] for k in ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY",
                                                       "MKL_ENABLE_INSTRUCTIONS") if k in os.environ},
              "variants": {}}
    rates: dict = {}
    table = []
    for variant in SHARD_ROOTS:
        work, ran = count_work(cfg, args.results, variant, tokenizers)
        for model, w in work.items():
            dtypes = sorted(ran[model]["dtypes"])
            if len(dtypes) != 1:
                raise SystemExit(f"{model} ({variant}): shards computed in {dtypes}; expected one dtype")
            body, head = linear_shapes(Path(ran[model]["path"]))
            dtype = args.dtype or dtypes[0]
            key = (model, dtype)
            if key not in rates:
                rates[key] = best_rate(body + [head], dtype, args.reps)
            body_params = sum(a * b for a, b in body)
            head_params = head[0] * head[1]
            flops = 2 * body_params * w["positions"] + 2 * head_params * w["logit_positions"]
            floor = flops / (rates[key]["gflops"] * 1e9)
            w.update({"compute_dtype": dtypes[0], "rated_dtype": dtype, "body_params": body_params,
                      "head_params": head_params,
                      "tflop": round(flops / 1e12, 3), "rate": rates[key], "floor_s": round(floor, 1),
                      "cell_seconds": round(w["cell_seconds"], 1),
                      # the run's seconds against a floor in another dtype compare nothing
                      "cell_seconds_over_floor": (round(w["cell_seconds"] / floor, 2)
                                                  if dtype == dtypes[0] else None)})
            record["variants"].setdefault(variant, {})[model] = w
            table.append([variant, model, dtype, w["positions"], w["logit_positions"],
                          w["tflop"], rates[key]["gflops"], w["floor_s"], w["cell_seconds"],
                          w["cell_seconds_over_floor"]])
    totals = {v: {"floor_s": round(sum(m["floor_s"] for m in ms.values()), 1),
                  "cell_seconds": round(sum(m["cell_seconds"] for m in ms.values()), 1)}
              for v, ms in record["variants"].items()}
    record["totals"] = totals
    head = ["variant", "model", "dtype", "positions", "logit positions", "TFLOP", "best GFLOP/s",
            "floor s", "cell s", "cell / floor"]
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for r in table:
        print("| " + " | ".join(str(x) for x in r) + " |")
    print(json.dumps(totals))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
