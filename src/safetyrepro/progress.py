"""The run's progress line: cells done of those left at start, and the time left estimated from
the cells done so far (the model workers' ``call`` events), printed every minute by the
workflow's Snakemake process.

Cells differ a lot in cost (a decode group's first cell decodes the whole group, a 0.5B model
is several times slower than a 135M one, chain-of-thought decodes 5x longer), so the estimate
is per cell kind: a cell left is costed at the mean of the done cells of its (model, template,
scoring); failing that, its model's mean scaled by how that kind compares over all models; then
the kind's mean; then the overall mean. The job hand-off around the calls is added as the
ratio of wall time to call time so far.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

from .worker.events import event_files, read_events

LABEL = re.compile(r"^(?P<model>[^/]+)/(?P<benchmark>[^/]+)/(?P<config>[^/ ]+)/s\d+ ")
Kind = tuple[str, str, str]   # (model, template, scoring)


def kind_of(model: str, config_id: str) -> Kind:
    parts = config_id.split("-")
    return model, parts[0], parts[-1]


def estimate_seconds(done: list[tuple[Kind, float]], left: list[Kind]) -> float | None:
    """Seconds of cell calls that ``left`` will take, from the ``done`` calls (kind, seconds);
    None before any call finished."""
    if not done:
        return None
    by_kind: dict[Kind, list[float]] = defaultdict(list)
    by_model: dict[str, list[float]] = defaultdict(list)
    by_shape: dict[tuple[str, str], list[float]] = defaultdict(list)
    for kind, sec in done:
        by_kind[kind].append(sec)
        by_model[kind[0]].append(sec)
        by_shape[kind[1:]].append(sec)

    def mean(xs):
        return sum(xs) / len(xs)

    overall = mean([s for _, s in done])
    total = 0.0
    for kind in left:
        if kind in by_kind:
            total += mean(by_kind[kind])
        elif kind[0] in by_model:
            shape = mean(by_shape[kind[1:]]) / overall if kind[1:] in by_shape else 1.0
            total += mean(by_model[kind[0]]) * shape
        elif kind[1:] in by_shape:
            total += mean(by_shape[kind[1:]])
        else:
            total += overall
    return total


def format_minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds < 5940 else f"{seconds / 3600:.1f} h"


class RunProgress:
    """Watches a run's shards appear and prints one progress line every ``every`` seconds.

    ``shards``: (shard path, model, config id, expected fingerprint or None) of every planned
    cell; a shard present at start with the expected fingerprint is not counted (a partial
    rerun counts only its own cells), and a counted cell is done once its shard is written after
    the start. ``every`` defaults to ``$SAFETYREPRO_PROGRESS_S`` or 60."""

    def __init__(self, results_dir, shards: list[tuple], *, every: float | None = None,
                 stream=None):
        self.results = Path(results_dir)
        self.t0 = time.time()
        self.every = every if every is not None else float(os.environ.get("SAFETYREPRO_PROGRESS_S") or 60)
        self.stream = stream if stream is not None else sys.stderr
        self.todo = [(Path(p), m, c) for p, m, c, *fp in shards if not _current(Path(p), fp[0] if fp else None)]
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def line(self, now: float | None = None) -> str | None:
        """The progress line now; None when this run has no cell to compute."""
        if not self.todo:
            return None
        now = time.time() if now is None else now
        left = [kind_of(m, c) for p, m, c in self.todo if not _written_since(p, self.t0)]
        n_done = len(self.todo) - len(left)
        events, _ = read_events(event_files(self.results), since=self.t0)
        done = []
        for ev in events:
            m = LABEL.match(str(ev.get("label", ""))) if ev.get("event") == "call" else None
            if m and ev.get("ok", True):
                done.append((kind_of(m["model"], m["config"]), float(ev.get("seconds", 0.0))))
        elapsed = now - self.t0
        head = f"[progress] cells {n_done} of {len(self.todo)} ({n_done / len(self.todo):.0%}), {format_minutes(elapsed)} elapsed"
        calls = sum(s for _, s in done)
        est = estimate_seconds(done, left)
        if est is None or calls <= 0:
            return head + "; time left: estimated once cells are done"
        first = min(float(ev.get("t_start", ev["t"])) for ev in events if ev.get("event") == "call")
        overhead = max(1.0, (now - first) / calls)   # job hand-off, loads, analysis around the calls
        return head + f"; about {format_minutes(est * overhead)} left (from the {len(done)} cells done so far)"

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            try:
                text = self.line()
            except Exception as exc:  # a progress line must never take the run down
                text = f"[progress] unavailable: {type(exc).__name__}: {exc}"
            if text:
                print(text, file=self.stream, flush=True)

    def start(self) -> "RunProgress":
        if self.todo:
            self._thread = threading.Thread(target=self._loop, name="safetyrepro-progress", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()


def _current(path: Path, fingerprint: str | None) -> bool:
    """Whether ``path`` exists and (when ``fingerprint`` is given) records that fingerprint."""
    if not path.exists():
        return False
    if fingerprint is None:
        return True
    import pyarrow.parquet as pq  # deferred: only the workflow's Snakemake process needs it

    try:
        meta = pq.read_schema(path).metadata or {}
        return json.loads(meta.get(b"safetyrepro", b"{}")).get("fingerprint") == fingerprint
    except Exception:  # unreadable: the workflow computes it again
        return False


def _written_since(path: Path, t0: float) -> bool:
    try:
        return path.stat().st_mtime >= t0 - 1.0   # file clocks run slightly behind time.time()
    except OSError:
        return False


def planned_shards(plan) -> list[tuple[Path, str, str, str]]:
    """(shard path, model, config id, expected fingerprint) of every cell of the run (main, and
    bf16 when on)."""
    variants = ["main"] + (["bf16"] if plan.precision_check else [])
    return [(plan.layout.shard_path(j.model, j.benchmark, j.config.id, j.seed, v), j.model, j.config.id,
             plan.cell_fingerprint(j.model, j.benchmark, j.config.id, j.seed, v))
            for v in variants for j in plan.jobs(v)]
