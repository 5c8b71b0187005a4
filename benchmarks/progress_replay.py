"""Replays a finished run's progress estimates against what actually happened (issue 29 item 4).

Reads a finished run's results folder (its workers' call events and the shards' write times)
and, every ``--every`` seconds of the run, asks the time-left estimate of this checkout
(:func:`safetyrepro.progress.seconds_left`) and of ``--baseline REV``'s progress module what it
would have printed then; "actual" is the time until the run's last cell shard was written.
Writes a JSON record with the CPU named.

    .venv/bin/python benchmarks/progress_replay.py --results /work/fresh/results \
        --config /work/fresh/config/config.yaml --baseline 2ad0a12
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from safetyrepro import progress  # noqa: E402
from safetyrepro.config import load_config  # noqa: E402
from safetyrepro.plan import Plan  # noqa: E402
from safetyrepro.worker.events import event_files, read_events  # noqa: E402


def baseline_module(rev: str):
    """``safetyrepro.progress`` as of ``rev`` (git show), imported from a temporary file as a
    module of this checkout's package (its relative imports, e.g. the event reader, resolve
    to this checkout's modules)."""
    text = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:src/safetyrepro/progress.py"],
                          check=True, capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "progress_baseline.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("safetyrepro._progress_baseline", path)
    mod = importlib.util.module_from_spec(spec)
    mod.__package__ = "safetyrepro"
    spec.loader.exec_module(mod)
    return mod


def baseline_seconds_left(mod, done, left, now, first, sizes, last):
    """The estimate the baseline's progress line printed, from the same done calls and cells
    left: its ``seconds_left`` where it has one (since decode groups were costed per group),
    else the first estimator's per-cell kind means times the ratio of wall time to call time."""
    if hasattr(mod, "seconds_left"):
        return mod.seconds_left(done, left, sizes, first, last, now)
    est = mod.estimate_seconds([(k, s) for k, _, s in done], [k for k, _ in left])
    calls = sum(s for *_, s in done)
    if est is None or calls <= 0:
        return None
    return est * max(1.0, (now - first) / calls)


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", required=True, help="a finished run's results folder")
    ap.add_argument("--config", required=True, help="the run config it was run with")
    ap.add_argument("--baseline", default="2ad0a12", help="revision whose estimate to compare")
    ap.add_argument("--every", type=float, default=60.0)
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/progress_replay.json"))
    a = ap.parse_args(argv)

    plan = Plan(load_config(a.config))
    results = Path(a.results)
    cells = [c._replace(path=results / Path(c.path).relative_to(plan.layout.results))
             for c in progress.planned_shards(plan)]
    written = {c: Path(c.path).stat().st_mtime for c in cells if Path(c.path).exists()}
    if len(written) != len(cells):
        raise SystemExit(f"{len(cells) - len(written)} of {len(cells)} planned shards are missing: "
                         "replay a finished run")
    sizes: dict = {}
    for c in cells:
        g = progress.group_of(c.variant, c.model, c.benchmark, c.config_id, c.seed)
        sizes[g] = sizes.get(g, 0) + 1
    events, _ = read_events(event_files(results))
    calls = []
    for ev in events:
        m = progress.LABEL.match(str(ev.get("label", ""))) if ev.get("event") == "call" else None
        if m and ev.get("ok", True):
            calls.append((float(ev["t"]), progress.kind_of(m["model"], m["config"]),
                          progress.group_of(m["variant"], m["model"], m["benchmark"], m["config"], int(m["seed"])),
                          float(ev["seconds"])))
    first = min(float(ev.get("t_start", ev["t"])) for ev in events if ev.get("event") == "call")
    end = max(written.values())
    base = baseline_module(a.baseline)
    rows = []
    t = first + a.every
    while t < end:
        done = [(k, g, s) for te, k, g, s in calls if te <= t]
        left = [(progress.kind_of(c.model, c.config_id),
                 progress.group_of(c.variant, c.model, c.benchmark, c.config_id, c.seed))
                for c in cells if written[c] > t]
        last = max((te for te, *_ in calls if te <= t), default=t)
        new = progress.seconds_left(done, left, sizes, first, last, t)
        old = baseline_seconds_left(base, done, left, t, first, sizes, last)
        rows.append({"minute": round((t - first) / 60, 1), "cells_done": len(cells) - len(left),
                     "actual_min": round((end - t) / 60, 2),
                     "estimate_min": None if new is None else round(new / 60, 2),
                     "baseline_estimate_min": None if old is None else round(old / 60, 2)})
        t += a.every

    def summary(key):
        errs = [abs(r[key] - r["actual_min"]) / max(r["actual_min"], 1.0) for r in rows if r[key] is not None]
        errs.sort()
        return {"median_rel_error": round(errs[len(errs) // 2], 3), "max_rel_error": round(errs[-1], 3)}

    record = {"benchmark": "progress_replay", "cpu": cpu_name(), "results": str(results),
              "baseline": a.baseline, "cells": len(cells), "cells_minutes": round((end - first) / 60, 2),
              "estimate": summary("estimate_min"), "baseline_estimate": summary("baseline_estimate_min"),
              "rows": rows}
    Path(a.out).write_text(json.dumps(record, indent=1) + "\n")
    for r in rows:
        print(f"{r['minute']:6.1f} min  cells {r['cells_done']:5d}  actual {r['actual_min']:6.2f}  "
              f"estimate {r['estimate_min']}  baseline {r['baseline_estimate_min']}")
    print(json.dumps({k: record[k] for k in ("estimate", "baseline_estimate", "cells_minutes")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
