"""The run's progress line: cells done of those left at start, and the time the cells still
need, estimated from the cells done so far (the model workers' ``call`` events), printed every
minute by the workflow's Snakemake process. The jobs after the cells (cross-package stage,
tables) are not in it, and the line says so ("of cells left").

Cells differ a lot in cost: a decode group's first cell decodes the whole group (up to 11
cells) and the others only collect their rows, a 0.5B model is several times slower than a 135M
one, chain-of-thought decodes 5x longer. So the compute left is costed per decode group: a group
not started yet costs its cells times the per-cell rate (call seconds of a started group /
its cells) of its (model, template, scoring); failing that, its model's rate scaled by how that
kind compares over all models; then the kind's rate; then the overall rate. Each job left adds
the hand-off seen so far (wall time not inside a call, per call done). A model with no cell
done yet is costed at the other models' rates, which can be far off (Qwen2.5-0.5B's cells take
about 1.8x SmolLM2's on a CPU), so the line names the models not started yet.
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
from typing import NamedTuple

from .worker.events import event_files, read_events

LABEL = re.compile(r"^(?P<model>[^/]+)/(?P<benchmark>[^/]+)/(?P<config>[^/ ]+)/s(?P<seed>\d+) "
                   r"\((?P<variant>[^,)]+)")
Kind = tuple[str, str, str]   # (model, template, scoring)


class PlannedCell(NamedTuple):
    path: Path
    model: str
    benchmark: str
    config_id: str
    seed: int
    variant: str = "main"
    fingerprint: str | None = None   # expected in the shard; None: any existing shard counts as done


def kind_of(model: str, config_id: str) -> Kind:
    parts = config_id.split("-")
    return model, parts[0], parts[-1]


def group_of(variant: str, model: str, benchmark: str, config_id: str, seed: int) -> tuple:
    """The decode group a cell is computed in: a free-form cell's template, shots and scoring
    (every decoding and seed of them decode together, :meth:`.plan.Plan.decode_group`); a
    logprob cell alone."""
    parts = config_id.split("-")
    if parts[-1] == "freeform":
        return variant, model, benchmark, parts[0], parts[2]
    return variant, model, benchmark, config_id, int(seed)


def estimate_seconds(done: list[tuple[Kind, tuple, float]], left: list[tuple[Kind, tuple]],
                     sizes: dict[tuple, int]) -> float | None:
    """Seconds of cell calls that the cells ``left`` (kind, group) will take, from the ``done``
    calls (kind, group, seconds); ``sizes``: planned cells per group. A group with a done call
    has done its decoding: its other cells cost nothing here. None before any call finished."""
    if not done:
        return None
    spent: dict[tuple, float] = defaultdict(float)
    kind_of_group: dict[tuple, Kind] = {}
    for kind, group, sec in done:
        spent[group] += sec
        kind_of_group[group] = kind
    by_kind: dict[Kind, list[float]] = defaultdict(list)
    by_model: dict[str, list[float]] = defaultdict(list)
    by_shape: dict[tuple[str, str], list[float]] = defaultdict(list)
    rates = []
    for group, sec in spent.items():   # one per-cell rate per started group
        kind, rate = kind_of_group[group], sec / max(1, sizes.get(group, 1))
        by_kind[kind].append(rate)
        by_model[kind[0]].append(rate)
        by_shape[kind[1:]].append(rate)
        rates.append(rate)

    def mean(xs):
        return sum(xs) / len(xs)

    overall = mean(rates)
    total = 0.0
    for kind, group in left:
        if group in spent:
            continue
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


def seconds_left(done: list[tuple[Kind, tuple, float]], left: list[tuple[Kind, tuple]], sizes: dict[tuple, int],
                 first_call: float, last_call_end: float, now: float) -> float | None:
    """The estimate the progress line prints: the compute left (:func:`estimate_seconds`) plus,
    per job left, the wall time between the first call's start and the last done call's end not
    spent inside a call (job hand-off, model loads) per call done; less the time since the last
    call ended, already spent on what is left (a call still running, a hand-off)."""
    est = estimate_seconds(done, left, sizes)
    if est is None:
        return None
    per_job = max(0.0, last_call_end - first_call - sum(sec for *_, sec in done)) / len(done)
    return max(0.0, est + per_job * len(left) - max(0.0, now - last_call_end))


def format_minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds < 5940 else f"{seconds / 3600:.1f} h"


class RunProgress:
    """Watches a run's shards appear and prints one progress line every ``every`` seconds.

    ``cells``: every planned cell (:class:`PlannedCell`); a shard present at start with the
    expected fingerprint is not counted (a partial rerun counts only its own cells), and a
    counted cell is done once its shard is written after the start. ``every`` defaults to
    ``$SAFETYREPRO_PROGRESS_S`` or 60."""

    def __init__(self, results_dir, cells: list[PlannedCell], *, every: float | None = None,
                 stream=None):
        self.results = Path(results_dir)
        self.t0 = time.time()
        self.every = every if every is not None else float(os.environ.get("SAFETYREPRO_PROGRESS_S") or 60)
        self.stream = stream if stream is not None else sys.stderr
        self.todo = [c for c in cells if not _current(Path(c.path), c.fingerprint)]
        self.sizes: dict[tuple, int] = defaultdict(int)
        for c in cells:
            self.sizes[group_of(c.variant, c.model, c.benchmark, c.config_id, c.seed)] += 1
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def line(self, now: float | None = None) -> str | None:
        """The progress line now; None when this run has no cell to compute."""
        if not self.todo:
            return None
        now = time.time() if now is None else now
        left = [(kind_of(c.model, c.config_id), group_of(c.variant, c.model, c.benchmark, c.config_id, c.seed))
                for c in self.todo if not _written_since(Path(c.path), self.t0)]
        n_done = len(self.todo) - len(left)
        events, _ = read_events(event_files(self.results), since=self.t0)
        done = []
        for ev in events:
            m = LABEL.match(str(ev.get("label", ""))) if ev.get("event") == "call" else None
            if m and ev.get("ok", True):
                done.append((kind_of(m["model"], m["config"]),
                             group_of(m["variant"], m["model"], m["benchmark"], m["config"], int(m["seed"])),
                             float(ev.get("seconds", 0.0))))
        elapsed = now - self.t0
        head = f"[progress] cells {n_done} of {len(self.todo)} ({n_done / len(self.todo):.0%}), {format_minutes(elapsed)} elapsed"
        calls = [ev for ev in events if ev.get("event") == "call"]
        first = min((float(ev.get("t_start", ev["t"])) for ev in calls), default=now)
        last = max((float(ev["t"]) for ev in calls), default=now)
        left_s = seconds_left(done, left, self.sizes, first, last, now)
        if left_s is None:
            return head + "; time left: estimated once cells are done"
        line = head + f"; about {format_minutes(left_s)} of cells left (from the {len(done)} done so far)"
        unseen = sorted({kind[0] for kind, _ in left} - {kind[0] for kind, *_ in done})
        if unseen:  # their cells are costed at the other models' rates: say so
            line += f"; not started yet: {', '.join(unseen)} (costed at the rates of the models done so far)"
        return line

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


def planned_shards(plan) -> list[PlannedCell]:
    """Every cell of the run (main, and bf16 when on) with its shard and expected fingerprint."""
    variants = ["main"] + (["bf16"] if plan.precision_check else [])
    return [PlannedCell(plan.layout.shard_path(j.model, j.benchmark, j.config.id, j.seed, v), j.model, j.benchmark,
                        j.config.id, j.seed, v, plan.cell_fingerprint(j.model, j.benchmark, j.config.id, j.seed, v))
            for v in variants for j in plan.jobs(v)]
