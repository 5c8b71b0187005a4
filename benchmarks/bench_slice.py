"""Benchmark 16: a fixed slice of the default run at two revisions, side by side.

Question: is the cell work of ``--candidate`` slower than that of ``--baseline``, and in which
kind of cell? Each revision is checked out into a temporary work tree (``git worktree``, with
``../shared`` beside it as in a fresh clone and ``resources/`` linked to this checkout's
prepared models, so no model is prepared inside the timing). In every round each revision runs
the same slice of the default grid through its own Snakefile (``snakemake <shard targets>``
on a fresh results folder), baseline and candidate alternating, so background load hits both.

The slice, per model of the default config (about 6% of the run's cells, all three models):

* ``freeform_greedy_sampled``: TruthfulQA T1 zero-shot, the whole decode group (greedy and
  T=0.3 / T=0.7 x 5 seeds: 11 cells, one group decode);
* ``cot``: BBQ T4 (chain of thought) zero-shot, the whole decode group;
* ``five_shot``: XSTest T2 five-shot, the whole decode group;
* ``logprob``: TruthfulQA T1 k0, BBQ T3 k5 and CrowS-Pairs T1 k0 logprob cells.

Per kind the record holds the seconds the model workers spent in those cells' calls (their
event logs: ``call`` events, microsecond resolution, the same at every revision since
91e5b38), the model loads, the whole Snakemake invocation's wall time, and per kind the ratio
candidate / baseline of each round and its median. Both sides use one interpreter (``--python``,
default this project's ``.venv``) with the work tree's ``src`` first on ``PYTHONPATH``.

    .venv/bin/python benchmarks/bench_slice.py --baseline 91e5b38 [--candidate HEAD] [--rounds 3]

``--candidate WORKTREE`` (a folder) times uncommitted code; ``--env K=V`` (repeatable) sets
an environment variable for the candidate's runs only, ``--env-both K=V`` for both sides (e.g.
``ONEDNN_MAX_CPU_ISA=AVX512_CORE``: oneDNN without its bf16 kernels, as on a CPU without AMX /
AVX512-BF16). ``machine`` in the record names the CPU and its bf16 support.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

MODELS = ("smollm2-135m", "qwen2.5-0.5b", "gemma3-270m")
GROUP_CELLS = [("greedy", 0)] + [(d, s) for d in ("t0.3", "t0.7") for s in range(5)]
SLICE = {
    "freeform_greedy_sampled": [("truthfulqa", f"T1-{d}-k0-freeform", s) for d, s in GROUP_CELLS],
    "cot": [("bbq", f"T4-{d}-k0-freeform", s) for d, s in GROUP_CELLS],
    "five_shot": [("xstest", f"T2-{d}-k5-freeform", s) for d, s in GROUP_CELLS],
    "logprob": [("truthfulqa", "T1-greedy-k0-logprob", 0), ("bbq", "T3-greedy-k5-logprob", 0),
                ("crows_pairs", "T1-greedy-k0-logprob", 0)],
}
LABEL = re.compile(r"^(?P<model>[^/]+)/(?P<benchmark>[^/]+)/(?P<config>[^/]+)/s(?P<seed>\d+) ")


def kind_of() -> dict[tuple[str, str, str, int], str]:
    return {(m, b, c, s): kind for kind, cells in SLICE.items() for m in MODELS for b, c, s in cells}


def targets() -> list[str]:
    """The slice's shard paths, relative to a work tree (results/ is the default results_dir
    at every revision)."""
    return [f"results/shards/{m}/{b}/{c}/s{s}.parquet" for (m, b, c, s) in kind_of()]


def worktree(spec: str, base: Path) -> tuple[Path, str]:
    """A work tree for ``spec`` (a revision, checked out detached at ``base/p``; or an existing
    folder, used as it is) with ``shared`` and ``resources`` beside / inside it."""
    if Path(spec).is_dir():
        tree = Path(spec).resolve()
        sha = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True,
                             text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(tree), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        return tree, sha + ("+uncommitted" if dirty else "")
    from safetyrepro.perf.worktrees import checkout

    tree = base / "p"
    sha = checkout(spec, tree)
    (base / "shared").symlink_to((ROOT.parent / "shared").resolve())
    resources = (ROOT / "resources").resolve()
    if not (resources / "models").is_dir():
        raise SystemExit(f"bench_slice: {resources}/models is missing: prepare the models first "
                         "(`make run`, or `safetyrepro prepare-model` for each model)")
    (tree / "resources").symlink_to(resources)
    return tree, sha


def call_seconds(results: Path) -> tuple[dict[str, float], dict[str, float], float, int]:
    """Seconds of the workers' cell calls per kind and per model, load seconds, call count."""
    kinds = kind_of()
    per_kind: dict[str, float] = {k: 0.0 for k in SLICE}
    per_model: dict[str, float] = {m: 0.0 for m in MODELS}
    load = 0.0
    n = 0
    for events in (results / ".workers").glob("*/events.jsonl"):
        for line in events.read_text(errors="replace").splitlines():
            try:
                ev = json.loads(line)
            except json.JSONDecodeError:
                continue
            if ev.get("event") == "load":
                load += float(ev.get("seconds", 0.0))
            if ev.get("event") != "call":
                continue
            m = LABEL.match(str(ev.get("label", "")))
            if not m:
                continue
            key = (m["model"], m["benchmark"], m["config"], int(m["seed"]))
            if key in kinds:
                per_kind[kinds[key]] += float(ev["seconds"])
                per_model[m["model"]] += float(ev["seconds"])
                n += 1
    return per_kind, per_model, load, n


def run_slice(python: str, tree: Path, cores: int, extra_env: dict[str, str], timeout: float) -> dict:
    results = tree / "results"
    shutil.rmtree(results, ignore_errors=True)
    env = dict(os.environ, PYTHONPATH=str(tree / "src"), **extra_env)
    snakemake = str(Path(python).parent / "snakemake")
    cmd = [snakemake, *targets(), "--cores", str(cores), "--resources", "gpu=1", "--configfile",
           "config/config.yaml", "--profile", "profiles/default"]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"bench_slice: snakemake failed in {tree} (exit {r.returncode}):\n"
                         + (r.stdout + r.stderr)[-3000:])
    per_kind, per_model, load, n = call_seconds(results)
    expected = len(kind_of())
    if n != expected:
        raise SystemExit(f"bench_slice: {tree}: {n} cell calls in the worker events, expected {expected}")
    return {"wall_s": round(wall, 3), "load_s": round(load, 3), "cells": n,
            "cell_call_s": {k: round(v, 3) for k, v in per_kind.items()},
            "cell_call_s_per_model": {k: round(v, 3) for k, v in per_model.items()},
            "cell_call_total_s": round(sum(per_kind.values()), 3)}


def main(argv=None) -> int:
    from safetyrepro.perf.args import revisions_parser

    ap = revisions_parser(__doc__, rounds=3, folders=True)
    ap.add_argument("--cores", type=int, default=1, help="snakemake --cores (the README's run uses 1)")
    ap.add_argument("--env", action="append", default=[], metavar="K=V",
                    help="environment for the candidate's runs only")
    ap.add_argument("--env-both", action="append", default=[], metavar="K=V",
                    help="environment for both sides (e.g. ONEDNN_MAX_CPU_ISA=AVX512_CORE: a CPU "
                         "without native bf16)")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per slice run")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "slice.json"))
    a = ap.parse_args(argv)
    if a.rounds < 1:
        raise SystemExit("bench_slice: --rounds must be >= 1")
    def parse_env(pairs: list[str], flag: str) -> dict[str, str]:
        env = {}
        for kv in pairs:
            k, sep, v = kv.partition("=")
            if not sep or not k:
                raise SystemExit(f"bench_slice: {flag} {kv!r} is not K=V")
            env[k] = v
        return env

    both_env = parse_env(a.env_both, "--env-both")
    cand_env = {**both_env, **parse_env(a.env, "--env")}
    from safetyrepro.perf.machine import cpu_features, machine_info

    tmp = Path(tempfile.mkdtemp(prefix="bench_slice."))
    made = []
    record = {"benchmark": "slice", "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "machine": {**machine_info(), **cpu_features()}, "slice": {k: len(v) * len(MODELS) for k, v in SLICE.items()},
              "baseline_env": both_env, "candidate_env": cand_env, "rounds": []}
    try:
        trees = {}
        for side, spec in (("baseline", a.baseline), ("candidate", a.candidate)):
            (tmp / side).mkdir()
            trees[side], record[f"{side}_commit"] = worktree(spec, tmp / side)
            if not Path(spec).is_dir():
                made.append(trees[side])
        for r in range(a.rounds):
            rnd = {"load_start": [round(x, 2) for x in os.getloadavg()]}
            order = ("baseline", "candidate") if r % 2 == 0 else ("candidate", "baseline")
            for side in order:
                env = cand_env if side == "candidate" else both_env
                rnd[side] = run_slice(a.python, trees[side], a.cores, env, a.timeout)
                print(f"round {r + 1} {side}: cells {rnd[side]['cell_call_total_s']:.1f} s, "
                      f"wall {rnd[side]['wall_s']:.1f} s", flush=True)
            record["rounds"].append(rnd)
    finally:
        from safetyrepro.perf.worktrees import remove

        for t in made:
            remove(t)
        shutil.rmtree(tmp, ignore_errors=True)
    ratios = {}
    for k in [*SLICE, "total"]:
        def sec(rnd, side):
            return rnd[side]["cell_call_total_s"] if k == "total" else rnd[side]["cell_call_s"][k]
        per = [sec(rnd, "candidate") / sec(rnd, "baseline") for rnd in record["rounds"] if sec(rnd, "baseline") > 0]
        ratios[k] = {"median": round(statistics.median(per), 3) if per else None,
                     "per_round": [round(x, 3) for x in per],
                     "baseline_median_s": round(statistics.median(sec(rnd, "baseline") for rnd in record["rounds"]), 2),
                     "candidate_median_s": round(statistics.median(sec(rnd, "candidate") for rnd in record["rounds"]), 2)}
    wall = [rnd["candidate"]["wall_s"] / rnd["baseline"]["wall_s"] for rnd in record["rounds"]]
    ratios["snakemake_wall"] = {"median": round(statistics.median(wall), 3), "per_round": [round(x, 3) for x in wall]}
    record["ratio_candidate_over_baseline"] = ratios
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"\n| kind | baseline s | candidate s | ratio (median) | per round |\n|---|---|---|---|---|")
    for k, v in ratios.items():
        print(f"| {k} | {v.get('baseline_median_s', '')} | {v.get('candidate_median_s', '')} | "
              f"{v['median']} | {', '.join(map(str, v['per_round']))} |")
    print(f"record: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
