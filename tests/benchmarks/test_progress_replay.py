"""benchmarks/progress_replay.py on a synthetic finished run of the tiny config: every planned
shard written at a known time, one call event per cell (a decode group's first cell carries the
group's seconds), so the time actually left at each minute is known and the replayed
estimates are compared with it."""

from __future__ import annotations

import json
import os
import subprocess

import yaml

from workflow_support import DATA, ROOT, TINY, benchmark_script


def test_replay_compares_both_estimates_with_the_time_left(tmp_path):
    from safetyrepro.config import load_config
    from safetyrepro.plan import Plan
    from safetyrepro.progress import group_of, planned_shards

    cfg = yaml.safe_load(TINY.read_text())
    cfg["data"]["local_dir"] = str(DATA)
    cfg["runtime"].update(resources_dir=str(tmp_path / "resources"), results_dir=str(tmp_path / "results"))
    cfg["envelope"]["rules"] = str(TINY.parent / "envelope_tiny.yaml")
    cfg["analysis"]["precision_check"] = False
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    cells = planned_shards(Plan(load_config(path)))
    events = tmp_path / "results" / ".workers" / "node" / "events.jsonl"
    events.parent.mkdir(parents=True)
    t, seen, lines = 1_800_000_000.0, set(), []
    for c in cells:   # every group costs 10 s per cell, all of it in its first cell's call
        g = group_of(c.variant, c.model, c.benchmark, c.config_id, c.seed)
        size = sum(group_of(x.variant, x.model, x.benchmark, x.config_id, x.seed) == g for x in cells)
        sec = 0.0 if g in seen else 10.0 * size
        seen.add(g)
        lines.append(json.dumps({"event": "call", "key": "k", "pid": 1, "host": "h", "t_start": t, "t": t + sec,
                                 "seconds": sec, "ok": True,
                                 "label": f"{c.model}/{c.benchmark}/{c.config_id}/s{c.seed} ({c.variant}, nf4)"}))
        t += sec + 1.0     # 1 s hand-off per job
        c.path.parent.mkdir(parents=True, exist_ok=True)
        c.path.write_bytes(b"x")
        os.utime(c.path, (t, t))
    events.write_text("\n".join(lines) + "\n")
    out = tmp_path / "replay.json"
    assert benchmark_script("progress_replay").main(["--results", str(tmp_path / "results"), "--config", str(path),
                           "--baseline", "2ad0a12", "--every", "60", "--out", str(out)]) == 0
    rec = json.loads(out.read_text())
    assert rec["cells"] == len(cells) and rec["rows"]
    # every group costs the same per cell: once a group has run, the estimate is close
    late = [r for r in rec["rows"] if r["cells_done"] > len(cells) // 4]
    assert all(abs(r["estimate_min"] - r["actual_min"]) <= 0.15 * r["actual_min"] + 0.1 for r in late), late
    # the baseline's per-cell means overshoot right after a group's first cell
    assert rec["baseline_estimate"]["max_rel_error"] > rec["estimate"]["max_rel_error"]
    # a baseline with relative imports and the current API (this checkout's own revision)
    # replays exactly what the current estimator says
    same = tmp_path / "same.json"
    assert benchmark_script("progress_replay").main(["--results", str(tmp_path / "results"), "--config", str(path),
                           "--baseline", "HEAD", "--every", "60", "--out", str(same)]) == 0
    rows = json.loads(same.read_text())["rows"]
    assert rows and all(r["baseline_estimate_min"] is not None for r in rows[1:])
    edited = subprocess.run(["git", "-C", str(ROOT), "diff", "--quiet", "HEAD", "--",
                             "src/safetyrepro/progress.py"]).returncode
    if not edited:   # (an uncommitted edit of the estimator would differ from HEAD's, rightly)
        assert all(r["baseline_estimate_min"] == r["estimate_min"] for r in rows)
