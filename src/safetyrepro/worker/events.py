"""Worker events (JSON lines) and the end-of-run summary: model loads and their share of
wall time.

Each worker appends to ``<state_dir>/events.jsonl``; every record has ``event``, ``key``,
``pid``, ``host`` and ``t`` (epoch seconds at the end of what it describes); timed records
also have ``t_start`` and ``seconds``:

    {"event": "start"}                                   process up, socket bound
    {"event": "device", "slot", "waited_s"}               device lock acquired
    {"event": "load", "loader", "seconds", "ok"}          state loaded (or failed to)
    {"event": "call", "target", "label", "seconds", "ok", "error_type"?}
    {"event": "exit", "reason", "n_calls", "uptime_s"}    about to exit (lock released at exit)

Standard library only.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (client start-up)
if TYPE_CHECKING:
    from typing import Any

from .layout import EVENTS_FILE, WORKERS_SUBDIR, open_private


def append_event(path: str | os.PathLike, record: dict[str, Any]) -> None:
    """Append one JSON line with a single O_APPEND write (lines from concurrent workers do
    not interleave)."""
    line = (json.dumps(record, sort_keys=True, default=str) + "\n").encode("utf-8")
    fd = open_private(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)   # 0600, no link followed
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def event_files(results_dir: str | os.PathLike) -> list[Path]:
    """All nodes' event files under ``<results_dir>/.workers/*/``."""
    root = Path(results_dir) / WORKERS_SUBDIR
    return sorted(root.glob(f"*/{EVENTS_FILE}"))


def _as_paths(paths: str | os.PathLike | Iterable[str | os.PathLike]) -> list[Path]:
    if isinstance(paths, (str, os.PathLike)):
        return [Path(paths)]
    return [Path(p) for p in paths]


def read_events(paths: str | os.PathLike | Iterable[str | os.PathLike],
                since: float | None = None) -> tuple[list[dict[str, Any]], int]:
    """Events from one or more files (missing files are empty), optionally only those that
    started at or after ``since`` (epoch seconds). Returns (events sorted by time, number of
    unreadable lines skipped, e.g. one cut short by a crash)."""
    events: list[dict[str, Any]] = []
    skipped = 0
    for path in _as_paths(paths):
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            continue
        for line in text.splitlines():
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                skipped += 1
                continue
            if not isinstance(rec, dict) or "event" not in rec or not isinstance(rec.get("t"), (int, float)):
                skipped += 1
                continue
            if since is not None and _start(rec) < since:
                continue
            events.append(rec)
    events.sort(key=lambda r: (_start(r), r["t"]))
    return events, skipped


def _start(rec: dict[str, Any]) -> float:
    ts = rec.get("t_start")
    return float(ts) if isinstance(ts, (int, float)) else float(rec["t"])


def summarize_events(paths: str | os.PathLike | Iterable[str | os.PathLike],
                     since: float | None = None,
                     wall_seconds: float | None = None) -> dict[str, Any]:
    """Per-key and total model loads, load seconds and call seconds, and the share of wall
    time spent loading.

    Wall time is ``wall_seconds`` if given (e.g. the run's own wall time), else from the
    first event's start to the last event's end. Only successful loads count as loads;
    failed ones are counted separately (their time still counts as loading time)."""
    events, skipped = read_events(paths, since=since)
    per_key: dict[str, dict[str, Any]] = {}

    def entry(key: str) -> dict[str, Any]:
        return per_key.setdefault(key, {"loads": 0, "failed_loads": 0, "load_seconds": 0.0,
                                        "calls": 0, "failed_calls": 0, "call_seconds": 0.0,
                                        "device_wait_seconds": 0.0, "workers": set(),
                                        "exits": {}})

    for rec in events:
        key = str(rec.get("key", "?"))
        e = entry(key)
        if "pid" in rec:
            e["workers"].add(rec["pid"])
        kind = rec["event"]
        secs = float(rec.get("seconds", 0.0) or 0.0)
        if kind == "load":
            e["load_seconds"] += secs
            if rec.get("ok", True):
                e["loads"] += 1
            else:
                e["failed_loads"] += 1
        elif kind == "call":
            e["calls"] += 1
            e["call_seconds"] += secs
            if not rec.get("ok", True):
                e["failed_calls"] += 1
        elif kind == "device":
            e["device_wait_seconds"] += float(rec.get("waited_s", 0.0) or 0.0)
        elif kind == "exit":
            reason = str(rec.get("reason", "?"))
            e["exits"][reason] = e["exits"].get(reason, 0) + 1

    for e in per_key.values():
        e["workers"] = len(e["workers"])
        e["load_seconds"] = round(e["load_seconds"], 6)
        e["call_seconds"] = round(e["call_seconds"], 6)
        e["device_wait_seconds"] = round(e["device_wait_seconds"], 6)

    if events:
        t_first = min(_start(r) for r in events)
        t_last = max(float(r["t"]) for r in events)
    else:
        t_first = t_last = None
    wall = float(wall_seconds) if wall_seconds is not None else (
        (t_last - t_first) if events else 0.0)
    load_seconds = sum(e["load_seconds"] for e in per_key.values())
    return {
        "keys": dict(sorted(per_key.items())),
        "loads": sum(e["loads"] for e in per_key.values()),
        "failed_loads": sum(e["failed_loads"] for e in per_key.values()),
        "max_loads_per_key": max((e["loads"] for e in per_key.values()), default=0),
        "load_seconds": round(load_seconds, 6),
        "calls": sum(e["calls"] for e in per_key.values()),
        "call_seconds": round(sum(e["call_seconds"] for e in per_key.values()), 6),
        "wall_seconds": round(wall, 6),
        "load_share": (load_seconds / wall) if wall > 0 else 0.0,
        "t_first": t_first,
        "t_last": t_last,
        "skipped_lines": skipped,
    }


def format_summary(summary: dict[str, Any]) -> str:
    """A short human-readable report of :func:`summarize_events`."""
    lines = [f"{'worker key':<40} {'loads':>5} {'load s':>9} {'calls':>6} {'call s':>9}"]
    for key, e in summary["keys"].items():
        failed = f" ({e['failed_loads']} failed)" if e["failed_loads"] else ""
        lines.append(f"{key:<40} {e['loads']:>5} {e['load_seconds']:>9.1f} {e['calls']:>6} "
                     f"{e['call_seconds']:>9.1f}{failed}")
    lines.append(f"model loads: {summary['loads']} (max {summary['max_loads_per_key']} per key); "
                 f"loading {summary['load_seconds']:.1f} s of {summary['wall_seconds']:.1f} s wall "
                 f"= {100 * summary['load_share']:.1f}%")
    return "\n".join(lines)
