"""Benchmark 12: the test suite's time at two revisions, side by side.

Question: does the suite at ``--candidate`` run slower than at ``--baseline``? Each revision
is checked out into a temporary work tree (``git worktree``, with ``../shared`` linked beside
it as in a fresh clone) and its tests run file by file with ``pytest -m "not slurm"`` (the
README's ``make test`` selection), alternating baseline / candidate on every test file that
both revisions have (paired by file name, whatever its folder under tests/), so that background
load hits both sides; the files only one side has run after that. Both sides use the same
interpreter (``--python``, default this project's ``.venv``) with the work tree's ``src`` first
on ``PYTHONPATH``.

The record (``benchmarks/results/test_suite.json``): per file the wall seconds, pytest's own
test count and outcome per side; the totals of the common files and their ratio; the files
each side has alone; the machine and its load. A failing file is reported, never dropped.

    .venv/bin/python benchmarks/bench_test_suite.py --baseline 6731747 --candidate HEAD
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))   # this checkout's package (perf.args, perf.worktrees)
SUMMARY = re.compile(r"(\d+) (passed|failed|error|errors|skipped|deselected|xfailed|xpassed)")


def worktree(rev: str, base: Path) -> tuple[Path, str]:
    """A detached work tree of ``rev`` at ``base/p`` with ``base/shared`` -> ../shared."""
    from safetyrepro.perf.worktrees import checkout

    tree = base / "p"
    sha = checkout(rev, tree)
    shared = ROOT.parent / "shared"
    if not shared.exists():
        raise SystemExit(f"bench_test_suite: {shared} is missing (the benchmark data the tests read)")
    (base / "shared").symlink_to(shared.resolve())
    return tree, sha


def test_files(tree: Path) -> dict[str, str]:
    """File name -> path under the tree. Test file names are unique across tests/ and its
    folders, so a file keeps its name when it moves between folders and both sides pair up."""
    return {p.name: p.relative_to(tree).as_posix() for p in sorted((tree / "tests").rglob("test_*.py"))}


def run_file(python: str, tree: Path, path: str, timeout: float) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree / "src"))
    env.pop("PYTEST_ADDOPTS", None)
    t0 = time.perf_counter()
    try:
        r = subprocess.run([python, "-m", "pytest", "-q", "-m", "not slurm", "-p", "no:cacheprovider",
                            path], cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
        out, rc = r.stdout + r.stderr, r.returncode
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        rc = "timeout"
    wall = time.perf_counter() - t0
    last = [ln for ln in out.strip().splitlines() if SUMMARY.search(ln)]
    counts = {k: int(n) for n, k in SUMMARY.findall(last[-1])} if last else {}
    # pytest exits 5 when every test of a file is deselected (all marked slurm): not a failure
    ok = rc in (0, 5) and not counts.get("failed") and not counts.get("error") and not counts.get("errors")
    return {"wall_s": round(wall, 2), "rc": rc, "ok": ok, "counts": counts,
            "summary": last[-1].strip() if last else out.strip().splitlines()[-1:] or ""}


def main(argv=None) -> int:
    from safetyrepro.perf.args import revisions_parser

    ap = revisions_parser(__doc__)
    ap.add_argument("--files", nargs="*", help="only these test files (file names, in any folder of tests/)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per test file")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "test_suite.json"))
    args = ap.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="bench-tests-"))
    trees, record = {}, {"benchmark": "test_suite", "command": " ".join([sys.executable] + sys.argv),
                         "machine": {"cpu": platform.processor() or platform.machine(),
                                     "cores": os.cpu_count(), "python": platform.python_version()},
                         "load_start": os.getloadavg()}
    try:
        for side, rev in (("baseline", args.baseline), ("candidate", args.candidate)):
            (tmp / side).mkdir()
            trees[side], record[f"{side}_commit"] = worktree(rev, tmp / side)
        files = {s: test_files(t) for s, t in trees.items()}
        common = sorted(set(files["baseline"]) & set(files["candidate"]))
        only = {s: sorted(set(files[s]) - set(common)) for s in trees}
        if args.files:
            common = [f for f in common if f in args.files]
            only = {s: [f for f in v if f in args.files] for s, v in only.items()}
        rows = []
        plan = [(f, ("baseline", "candidate") if i % 2 == 0 else ("candidate", "baseline"))
                for i, f in enumerate(common)]
        for i, (f, order) in enumerate(plan, 1):
            row = {"file": f}
            for side in order:
                row[side] = run_file(args.python, trees[side], files[side][f], args.timeout)
            rows.append(row)
            b, c = row["baseline"], row["candidate"]
            print(f"[{i}/{len(plan)}] {f}: baseline {b['wall_s']:.1f} s ({b['summary']}), "
                  f"candidate {c['wall_s']:.1f} s ({c['summary']})", flush=True)
        alone = {s: [{"file": f, **run_file(args.python, trees[s], files[s][f], args.timeout)} for f in only[s]]
                 for s in trees}
        tb = sum(r["baseline"]["wall_s"] for r in rows)
        tc = sum(r["candidate"]["wall_s"] for r in rows)
        record.update({
            "common_files": rows, "only_baseline": alone["baseline"], "only_candidate": alone["candidate"],
            "common_baseline_s": round(tb, 1), "common_candidate_s": round(tc, 1),
            "common_ratio_candidate_over_baseline": round(tc / tb, 3) if tb else None,
            "only_baseline_s": round(sum(r["wall_s"] for r in alone["baseline"]), 1),
            "only_candidate_s": round(sum(r["wall_s"] for r in alone["candidate"]), 1),
            "failing": [f"{s}:{r['file']}" for r in rows for s in ("baseline", "candidate") if not r[s]["ok"]]
                       + [f"{s}:{r['file']}" for s in alone for r in alone[s] if not r["ok"]],
            "load_end": os.getloadavg(),
        })
        record["total_baseline_s"] = round(tb + record["only_baseline_s"], 1)
        record["total_candidate_s"] = round(tc + record["only_candidate_s"], 1)
    finally:
        from safetyrepro.perf.worktrees import remove

        for t in trees.values():
            remove(t)
        shutil.rmtree(tmp, ignore_errors=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    print(f"\n| side | common files (s) | files of its own (s) | total (s) |\n|---|---|---|---|\n"
          f"| baseline {record['baseline_commit'][:7]} | {record['common_baseline_s']} | "
          f"{record['only_baseline_s']} | {record['total_baseline_s']} |\n"
          f"| candidate {record['candidate_commit'][:7]} | {record['common_candidate_s']} | "
          f"{record['only_candidate_s']} | {record['total_candidate_s']} |\n\n"
          f"common files: candidate / baseline = {record['common_ratio_candidate_over_baseline']}; "
          f"failing: {record['failing'] or 'none'}; record: {args.out}")
    return 0 if not record["failing"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
