"""Whole-run profile of a finished workflow run (benchmark 4 of benchmarks/README.md).

Reads what a run leaves behind — the Snakemake log, the model workers' event log and the cell
logs — and prints: wall time, time per stage (rule), model loads and the load share, tokens
processed per second by the cell jobs, the workers' peak memory, and Snakemake's scheduling
overhead per job (wall time during which no job ran, divided by the number of jobs; jobs side by
side, as with ``--cores 2``, count once).

    .venv/bin/python benchmarks/profile_run.py --results results [--log .snakemake/log/<file>]

Without --log the newest Snakemake log that executed jobs is used (a dry run, `--report` or
`--lint` also writes a log, with none); with --log a log without finished jobs is refused. Times in the Snakemake log have one-second
resolution, so per-rule sums are exact to about a second per job boundary; the worker event
log (cell call and load times) has microsecond resolution.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

STAMP = re.compile(r"^\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]$")
START = re.compile(r"^(?:local)?rule ([\w.+-]+):$")
JOBID = re.compile(r"^\s+jobid: (\d+)$")
OUTPUT = re.compile(r"^\s+output: (.*)$")
DONE = re.compile(r"^Finished jobid: (\d+) \(Rule: ([\w.+-]+)\)$")


def stage_of(rule: str, output: str) -> str:
    """The rule, with the decode groups' jobs (``cell_group_<variant>``) as cells and the
    precision check's cells (output under shards_bf16/) as cell_bf16."""
    rule = "cell" if rule.startswith("cell_group_") else rule
    return "cell_bf16" if rule == "cell" and "/shards_bf16/" in output else rule


def pick_log(logs: list[Path]) -> tuple[Path, dict]:
    """The newest of ``logs`` whose run finished at least one job, and its parse."""
    for log in sorted(logs, key=lambda p: p.stat().st_mtime, reverse=True):
        parsed = parse_log(log)
        if parsed["n_jobs"] and parsed["first"] is not None:
            return log, parsed
    raise SystemExit(f"none of the {len(logs)} Snakemake log(s) records a finished job (dry runs, "
                     "--report and --lint write such logs); pass the log of a real run with --log")


def parse_log(path: Path) -> dict:
    now = None
    pending_rule = pending_output = None
    starts, ends, rule_of = {}, {}, {}
    first = last = None
    for line in path.read_text(errors="replace").splitlines():
        m = STAMP.match(line.strip())
        if m:
            now = dt.datetime.strptime(m.group(1), "%a %b %d %H:%M:%S %Y").timestamp()
            first = now if first is None else first
            last = now
            continue
        m = START.match(line.strip())
        if m:
            pending_rule, pending_output = m.group(1), ""
            continue
        m = OUTPUT.match(line)
        if m and pending_rule is not None:
            pending_output = m.group(1)
            continue
        m = JOBID.match(line)
        if m and pending_rule is not None:
            starts[int(m.group(1))] = now
            rule_of[int(m.group(1))] = stage_of(pending_rule, pending_output)
            pending_rule = None
            continue
        m = DONE.match(line.strip())
        if m:
            ends[int(m.group(1))] = now
    per_rule = defaultdict(lambda: [0, 0.0])
    spans: dict[str, list[float]] = {}
    intervals = []
    for j, t0 in starts.items():
        if j in ends and t0 is not None:
            stage = rule_of[j]
            per_rule[stage][0] += 1
            per_rule[stage][1] += ends[j] - t0
            lo, hi = spans.get(stage, (t0, ends[j]))
            spans[stage] = [min(lo, t0), max(hi, ends[j])]
            intervals.append((t0, ends[j]))
    return {"first": first, "last": last, "per_stage": dict(per_rule), "n_jobs": len(ends),
            "stage_span": {k: hi - lo for k, (lo, hi) in spans.items()}, "busy": busy_seconds(intervals)}


def busy_seconds(intervals: list[tuple[float, float]]) -> float:
    """Seconds during which at least one job ran (the union of the jobs' intervals): with
    --cores > 1 single-core jobs run side by side, so their sum overstates the wall time."""
    total, end = 0.0, None
    for lo, hi in sorted(intervals):
        if end is None or lo > end:
            total += hi - lo
            end = hi
        elif hi > end:
            total += hi - end
            end = hi
    return total


def cell_stats(results: Path) -> dict:
    tokens = gen = 0
    rss = 0.0
    n = 0
    for f in (results / "logs" / "cells").rglob("*.log"):
        for line in f.read_text(errors="replace").splitlines():
            if line.startswith("{") and '"tokens"' in line:
                d = json.loads(line)
                tokens += d.get("tokens", 0)
                gen += d.get("generated_tokens", 0)
                rss = max(rss, d.get("peak_rss_mb", 0.0))
                n += 1
    return {"cells": n, "tokens": tokens, "generated_tokens": gen, "peak_rss_mb": rss}


LABEL = re.compile(r"^(?P<model>[^/]+)/(?P<benchmark>[^/]+)/(?P<config>[^/ ]+)/s\d+ ")


def call_breakdown(results: Path, since: float | None) -> dict:
    """Seconds of the workers' cell calls per model, template, shots, decoding, scoring and
    model x template: where the cell time goes (a decode group's first cell carries the group)."""
    from safetyrepro.worker.events import event_files, read_events

    events, _ = read_events(event_files(results), since=since)
    out: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for ev in events:
        m = LABEL.match(str(ev.get("label", ""))) if ev.get("event") == "call" else None
        if not m:
            continue
        template, decoding, shots, scoring = m["config"].split("-")
        sec = float(ev.get("seconds", 0.0))
        for axis, value in (("model", m["model"]), ("benchmark", m["benchmark"]), ("template", template),
                            ("shots", shots), ("decoding", decoding), ("scoring", scoring),
                            ("model_template", f"{m['model']} {template}"),
                            ("model_shots", f"{m['model']} {shots}")):
            out[axis][value] += sec
    return {axis: {k: round(v, 1) for k, v in sorted(vals.items())} for axis, vals in out.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", default=str(ROOT / "results"))
    ap.add_argument("--log", default=None,
                    help="Snakemake log (default: the newest of the run's own .snakemake/log, "
                         "beside --results)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    results = Path(a.results)
    if a.log:
        log, parsed = Path(a.log), parse_log(Path(a.log))
        if not parsed["n_jobs"] or parsed["first"] is None:
            raise SystemExit(f"{log}: no finished job in this log (a dry run, --report or --lint?); "
                             "pass the log of a run that executed jobs")
    else:
        # the run's own logs: a run in another checkout keeps them beside its results folder
        logs = results.resolve().parent / ".snakemake" / "log"
        log, parsed = pick_log(list(logs.glob("*.snakemake.log")))
    from safetyrepro.worker.events import event_files, summarize_events

    wall = (parsed["last"] or 0) - (parsed["first"] or 0)
    workers = summarize_events(event_files(results), since=parsed["first"], wall_seconds=wall)
    cells = cell_stats(results)
    in_jobs = parsed["busy"]
    out = {
        "log": str(log), "wall_s": wall, "jobs": parsed["n_jobs"],
        # seconds: the stage's jobs' durations summed; span_s: its first start to its last end
        "per_stage": {k: {"jobs": v[0], "seconds": v[1], "span_s": parsed["stage_span"][k]}
                      for k, v in sorted(parsed["per_stage"].items())},
        "seconds_with_a_job_running": in_jobs,
        "model_loads": workers["loads"], "max_loads_per_worker": workers["max_loads_per_key"],
        "load_seconds": workers["load_seconds"], "load_share": workers["load_share"],
        "cell_call_seconds": workers["call_seconds"],
        "tokens_per_s_in_cells": cells["tokens"] / workers["call_seconds"] if workers["call_seconds"] else None,
        "generated_tokens": cells["generated_tokens"], "tokens": cells["tokens"],
        "worker_peak_rss_mb": cells["peak_rss_mb"],
        "scheduling_overhead_per_job_s": (wall - in_jobs) / parsed["n_jobs"] if parsed["n_jobs"] else None,
        "cell_call_seconds_by": call_breakdown(results, parsed["first"]),
        "client_overhead_per_cell_s": ((parsed["per_stage"].get("cell", [0, 0])[1]
                                        + parsed["per_stage"].get("cell_bf16", [0, 0])[1]
                                        - workers["call_seconds"] - workers["load_seconds"])
                                       / max(1, parsed["per_stage"].get("cell", [0])[0]
                                             + parsed["per_stage"].get("cell_bf16", [0])[0])),
    }
    if a.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"log: {log}")
    print(f"wall time: {wall:.0f} s ({wall / 60:.1f} min), {out['jobs']} jobs")
    print(f"{'stage':<22} {'jobs':>6} {'seconds':>9} {'share':>7} {'span s':>8}")
    for k, v in out["per_stage"].items():
        print(f"{k:<22} {v['jobs']:>6} {v['seconds']:>9.0f} {v['seconds'] / wall:>7.1%} {v['span_s']:>8.0f}")
    print(f"model loads: {out['model_loads']} (max {out['max_loads_per_worker']} per worker), "
          f"{out['load_seconds']:.1f} s = {out['load_share']:.1%} of wall time")
    print(f"cell compute inside workers: {out['cell_call_seconds']:.0f} s; "
          f"{out['tokens']:,} tokens processed ({out['generated_tokens']:,} generated), "
          f"{out['tokens_per_s_in_cells'] or 0:,.0f} tokens/s")
    print(f"worker peak memory (max RSS): {out['worker_peak_rss_mb']:.0f} MB")
    for axis, vals in out["cell_call_seconds_by"].items():
        print(f"cell calls by {axis}: " + ", ".join(f"{k} {v:.0f} s" for k, v in vals.items()))
    print(f"Snakemake scheduling overhead: {out['scheduling_overhead_per_job_s']:.3f} s per job; "
          f"client + IPC per cell or decode-group job: {out['client_overhead_per_cell_s']:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
