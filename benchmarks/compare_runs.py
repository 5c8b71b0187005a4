"""Compare two results folders of the workflow: are the cells' raw outputs and the tables the same?

Used to show that a restructuring changed no output: run the workflow at the old and at the
new commit on the same config (each in its own clone), then

    .venv/bin/python benchmarks/compare_runs.py OLD/results NEW/results --out benchmarks/results/compare_runs.json

Per shard that both runs wrote (``shards/`` and ``shards_bf16/``, matched by path): whether its
rows are identical in what the model produced (item ids, prompts, raw outputs, candidate
log-likelihoods and token counts, chosen index, prompt / generated token counts, finish
reason; floats compared exactly) and, separately, in the write-time parse (parsed label, parse
flag, correctness), counted per benchmark and per decoding kind (greedy free-form, sampled
free-form, logprob). Per table in ``tables/`` that both wrote: identical or not, and where not,
which columns differ in how many rows, overall and per benchmark. With ``--reparse``, every
item-level parse difference (``item_results``) whose two raw outputs are identical is re-scored
with the installed parsers (this checkout's ``safetyrepro``) from the OLD run's raw output: if
that gives the NEW run's label, the difference comes from a parser change, not from the runs.
Shards and tables only one run has are listed. Exits 0 whatever it finds; the record says it.
"""

from __future__ import annotations

import argparse
import json
import math
from collections import Counter, defaultdict
from pathlib import Path

import pandas as pd

RAW = ["item_id", "prompt_hash", "prompt", "raw_output", "cand_logliks", "cand_ntokens", "chosen_index",
       "n_prompt_tokens", "n_gen_tokens", "finish_reason"]
PARSE = ["parsed_label", "parse_ok", "correct"]


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if a is None or b is None:
        return a is None and b is None
    if hasattr(a, "tolist"):
        a = a.tolist()
    if hasattr(b, "tolist"):
        b = b.tolist()
    return a == b


def _kind(config_id: str) -> str:
    parts = config_id.split("-")
    if parts[-1] == "logprob":
        return "logprob"
    return "greedy free-form" if parts[1] == "greedy" else "sampled free-form"


def compare_shards(old: Path, new: Path) -> dict:
    paths = {}
    for side, root in (("old", old), ("new", new)):
        paths[side] = {str(p.relative_to(root)) for d in ("shards", "shards_bf16") if (root / d).is_dir()
                       for p in (root / d).rglob("s*.parquet")}
    both = sorted(paths["old"] & paths["new"])
    tally = defaultdict(Counter)      # (benchmark, kind) -> counts
    raw_diffs, parse_diffs = [], []
    for rel in both:
        a, b = pd.read_parquet(old / rel), pd.read_parquet(new / rel)
        parts = Path(rel).parts        # shards/<model>/<benchmark>/<config>/s<seed>.parquet
        key = (parts[0], parts[2], _kind(parts[3]))
        t = tally[key]
        t["shards"] += 1
        raw_cols = [c for c in RAW if c in a.columns and c in b.columns]
        if len(a) != len(b) or list(a["item_id"]) != list(b["item_id"]):
            t["raw_differs"] += 1
            raw_diffs.append({"shard": rel, "rows": [len(a), len(b)], "why": "other items or order"})
            continue
        bad = {c: sum(not _same(x, y) for x, y in zip(a[c], b[c])) for c in raw_cols}
        bad = {c: n for c, n in bad.items() if n}
        t["rows"] += len(a)
        if bad:
            t["raw_differs"] += 1
            t["rows_raw_differs"] += max(bad.values())
            first = next(i for i in range(len(a)) if any(not _same(a[c].iloc[i], b[c].iloc[i]) for c in bad))
            raw_diffs.append({"shard": rel, "columns": bad, "first_item": a["item_id"].iloc[first]})
        pbad = {c: sum(not _same(x, y) for x, y in zip(a[c], b[c])) for c in PARSE if c in a.columns and c in b.columns}
        pbad = {c: n for c, n in pbad.items() if n}
        if pbad:
            t["parse_differs"] += 1
            parse_diffs.append({"shard": rel, "columns": pbad})
    per = [{"variant_root": k[0], "benchmark": k[1], "kind": k[2], **dict(v)} for k, v in sorted(tally.items())]
    return {"shards_compared": len(both), "only_old": sorted(paths["old"] - paths["new"]),
            "only_new": sorted(paths["new"] - paths["old"]), "per_benchmark_kind": per,
            "shards_raw_identical": len(both) - len(raw_diffs), "raw_differences": raw_diffs,
            "write_time_parse_differences": parse_diffs}


def compare_tables(old: Path, new: Path) -> dict:
    names = {s: {p.name for p in (r / "tables").glob("*.parquet")} for s, r in (("old", old), ("new", new))}
    out = []
    for name in sorted(names["old"] & names["new"]):
        a, b = pd.read_parquet(old / "tables" / name), pd.read_parquet(new / "tables" / name)
        row = {"table": name, "rows": [len(a), len(b)]}
        cols = [c for c in a.columns if c in b.columns]
        row["columns_only_old"] = sorted(set(a.columns) - set(b.columns))
        row["columns_only_new"] = sorted(set(b.columns) - set(a.columns))
        if len(a) != len(b):
            row["identical"] = False
            if "benchmark" in a.columns and "benchmark" in b.columns:
                ca, cb = a["benchmark"].value_counts(), b["benchmark"].value_counts()
                row["rows_per_benchmark"] = {str(k): [int(ca.get(k, 0)), int(cb.get(k, 0))]
                                             for k in sorted(set(ca.index) | set(cb.index))}
            out.append(row)
            continue
        a, b = a.reset_index(drop=True), b.reset_index(drop=True)
        diff = {c: [i for i in range(len(a)) if not _same(a[c].iloc[i], b[c].iloc[i])] for c in cols}
        diff = {c: rows for c, rows in diff.items() if rows}
        row["identical"] = not diff and not row["columns_only_old"] and not row["columns_only_new"]
        row["values_identical_in_common_columns"] = not diff
        row["differing_rows_per_column"] = {c: len(r) for c, r in diff.items()}
        if diff and "benchmark" in a.columns:
            rows = sorted({i for r in diff.values() for i in r})
            row["differing_rows_per_benchmark"] = dict(Counter(str(a["benchmark"].iloc[i]) for i in rows))
        out.append(row)
    return {"tables": out, "only_old": sorted(names["old"] - names["new"]),
            "only_new": sorted(names["new"] - names["old"])}


def reparse_item_differences(old: Path, new: Path) -> dict:
    """Item-level parse differences between the runs' item_results, and whether the installed
    parsers reading the OLD run's raw output give the NEW run's label."""
    from safetyrepro.items import read_items
    from safetyrepro.tasks import load_task

    key = ["model", "benchmark", "config", "seed", "item_id"]
    a = pd.read_parquet(old / "tables" / "item_results.parquet")
    b = pd.read_parquet(new / "tables" / "item_results.parquet")
    m = a.merge(b, on=key, suffixes=("_old", "_new"))
    differs = m[(m["parsed_label_old"].fillna("<none>") != m["parsed_label_new"].fillna("<none>"))
                | (m["correct_old"] != m["correct_new"])]
    counts = Counter()
    unexplained = []
    items = {}
    for r in differs.itertuples(index=False):
        shard = f"shards/{r.model}/{r.benchmark}/{r.config}/s{r.seed}.parquet"
        so, sn = pd.read_parquet(old / shard).set_index("item_id"), pd.read_parquet(new / shard).set_index("item_id")
        if not _same(so.loc[r.item_id, "raw_output"], sn.loc[r.item_id, "raw_output"]) or \
                not _same(so.loc[r.item_id, "cand_logliks"], sn.loc[r.item_id, "cand_logliks"]):
            counts[(r.benchmark, "raw output differs")] += 1
            continue
        if r.benchmark not in items:
            df, _ = read_items(new / "items" / f"{r.benchmark}.parquet")
            items[r.benchmark] = {x["item_id"]: x for x in df.to_dict(orient="records")}
        task, it = load_task(r.benchmark), items[r.benchmark][r.item_id]
        if r.config.endswith("logprob"):
            res = task.score_logprob(it, list(so.loc[r.item_id, "cand_logliks"]), list(so.loc[r.item_id, "cand_ntokens"]))
        else:
            res = task.score_freeform(it, so.loc[r.item_id, "raw_output"] or "")
        if res.parsed_label == r.parsed_label_new and bool(res.correct) == bool(r.correct_new):
            counts[(r.benchmark, "parser change (current parser on the old raw output = new label)")] += 1
        else:
            counts[(r.benchmark, "unexplained")] += 1
            unexplained.append({k: getattr(r, k) for k in key})
    return {"item_rows_compared": int(len(m)), "item_rows_only_old": int(len(a) - len(m)),
            "item_rows_only_new": int(len(b) - len(m)), "parse_differences": int(len(differs)),
            "by_benchmark_and_cause": [{"benchmark": k[0], "cause": k[1], "rows": n} for k, n in sorted(counts.items())],
            "unexplained": unexplained[:50]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("--reparse", action="store_true")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    rec = {"old": str(args.old.resolve()), "new": str(args.new.resolve()),
           "shards": compare_shards(args.old, args.new), "tables": compare_tables(args.old, args.new)}
    if args.reparse:
        rec["item_parse"] = reparse_item_differences(args.old, args.new)
    s = rec["shards"]
    print(f"shards compared: {s['shards_compared']} (only old: {len(s['only_old'])}, only new: {len(s['only_new'])}); "
          f"raw outputs identical: {s['shards_raw_identical']}; write-time parse differs in "
          f"{len(s['write_time_parse_differences'])}")
    print("| shards | benchmark | kind | shards | rows | raw differs | parse differs |\n|---|---|---|---|---|---|---|")
    for r in s["per_benchmark_kind"]:
        print(f"| {r['variant_root']} | {r['benchmark']} | {r['kind']} | {r.get('shards', 0)} | {r.get('rows', 0)} | "
              f"{r.get('raw_differs', 0)} | {r.get('parse_differs', 0)} |")
    print("\n| table | identical | differing rows per column | per benchmark |\n|---|---|---|---|")
    for t in rec["tables"]["tables"]:
        print(f"| {t['table']} | {t['identical']} | {t.get('differing_rows_per_column', t['rows'])} | "
              f"{t.get('differing_rows_per_benchmark', t.get('rows_per_benchmark', ''))} |")
    print(f"tables only old: {rec['tables']['only_old']}; only new: {rec['tables']['only_new']}")
    if args.reparse:
        print(json.dumps(rec["item_parse"]["by_benchmark_and_cause"], indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(rec, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
