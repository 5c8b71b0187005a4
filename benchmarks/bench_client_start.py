"""Benchmark 24: a cell job's client start-up at two revisions, side by side.

Every cell job of a run (1,830 in the default run) starts ``python -m safetyrepro.cell_client``,
which imports the client's modules before it hands the cell to the model's worker. This
times that start-up (the same command with ``--help``: the same imports, then the usage text
instead of the hand-off) at ``--baseline`` and ``--candidate``, each checked out into a
temporary work tree and run with its ``src`` on ``PYTHONPATH`` and this project's interpreter,
in two states of the work tree:

* ``source``: no ``__pycache__`` in the tree, under ``PYTHONDONTWRITEBYTECODE=1``: a fresh
  clone where Python writes no bytecode itself (as on this project's machines), so every
  process compiles the package's modules again;
* ``bytecode``: after ``compileall`` of the tree's ``src`` (what the workflow's start does
  since ``caba1bd``, :func:`safetyrepro.sysutil.compile_bytecode`).

In every round each side runs ``--runs`` processes one after another (the round's value is
their median), baseline and candidate alternating. The record holds every round, the medians
and the ratios candidate / baseline per state, and ``as_run``: the candidate with bytecode over
the baseline from source (what a fresh-clone run of each revision pays per job).

    .venv/bin/python benchmarks/bench_client_start.py --baseline 39ca097 [--candidate HEAD]
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from safetyrepro.perf import worktrees  # noqa: E402
from safetyrepro.perf.args import revisions_parser  # noqa: E402

STATES = ("source", "bytecode")
COMMAND = ["-m", "safetyrepro.cell_client", "--help"]


def drop_bytecode(tree: Path) -> None:
    for cache in (tree / "src").rglob("__pycache__"):
        shutil.rmtree(cache)


def start_ms(python: str, tree: Path, runs: int) -> float:
    """Median wall milliseconds of ``runs`` client start-ups from ``tree``'s sources."""
    env = {**os.environ, "PYTHONPATH": str(tree / "src"), "PYTHONDONTWRITEBYTECODE": "1"}
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run([python, *COMMAND], env=env, check=True, stdout=subprocess.DEVNULL)
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def main(argv=None) -> int:
    ap = revisions_parser(__doc__, rounds=5)
    ap.add_argument("--runs", type=int, default=30, help="processes per side and round")
    ap.add_argument("--out", default=None, help="folder of the JSON record (default benchmarks/results)")
    a = ap.parse_args(argv)
    if a.rounds < 1 or a.runs < 1:
        raise SystemExit("bench_client_start: --rounds and --runs must be >= 1")

    from safetyrepro.perf.report import publish

    tmp = Path(tempfile.mkdtemp(prefix="bench_client_start."))
    trees, commits = {}, {}
    times: dict[str, dict[str, list[float]]] = {s: {"baseline": [], "candidate": []} for s in STATES}
    load_start = [round(x, 2) for x in os.getloadavg()]
    try:
        for side, rev in (("baseline", a.baseline), ("candidate", a.candidate)):
            trees[side] = tmp / side
            commits[side] = worktrees.checkout(rev, trees[side])
        for state in STATES:
            for tree in trees.values():
                drop_bytecode(tree)
                if state == "bytecode":
                    subprocess.run([a.python, "-m", "compileall", "-q", str(tree / "src")], check=True)
            for r in range(a.rounds):
                order = ("baseline", "candidate") if r % 2 == 0 else ("candidate", "baseline")
                for side in order:
                    ms = start_ms(a.python, trees[side], a.runs)
                    times[state][side].append(round(ms, 2))
                    print(f"  {state:8s} round {r + 1}/{a.rounds} {side:9s} {ms:6.1f} ms", flush=True)
    finally:
        for tree in trees.values():
            worktrees.remove(tree)
        shutil.rmtree(tmp, ignore_errors=True)

    med = {s: {side: round(statistics.median(v), 2) for side, v in sides.items()} for s, sides in times.items()}
    ratios = {s: round(med[s]["candidate"] / med[s]["baseline"], 3) for s in STATES}
    paired = {s: [round(c / b, 3) for b, c in zip(times[s]["baseline"], times[s]["candidate"])] for s in STATES}
    as_run = round(med["bytecode"]["candidate"] / med["source"]["baseline"], 3)
    rows = [[s, med[s]["baseline"], med[s]["candidate"], f"{ratios[s]:.3f}"] for s in STATES]
    rows.append(["as run (candidate bytecode / baseline source)", med["source"]["baseline"],
                 med["bytecode"]["candidate"], f"{as_run:.3f}"])
    payload = {"baseline_commit": commits["baseline"], "candidate_commit": commits["candidate"],
               "command_timed": ["python", *COMMAND], "rounds": a.rounds, "runs_per_round": a.runs,
               "load_start": load_start, "load_end": [round(x, 2) for x in os.getloadavg()],
               "times_ms": times, "median_ms": med, "ratio_candidate_over_baseline": ratios,
               "paired_ratios": paired, "as_run_ratio": as_run,
               "saved_ms_per_job_as_run": round(med["source"]["baseline"] - med["bytecode"]["candidate"], 2)}
    publish("client_start", ["state", "baseline ms", "candidate ms", "candidate / baseline"], rows,
            payload, out_dir=a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
