"""Side-by-side timing: the compared implementations run ALTERNATELY (a, b, a, b, ...) in
the same process, so background load and thermal drift hit both; results are reported as
ratios of medians plus the per-round (paired) ratios."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable


@dataclass
class Timed:
    times: dict[str, list[float]] = field(default_factory=dict)  # name -> seconds per round
    results: dict[str, object] = field(default_factory=dict)     # name -> last run's result

    def median(self, name: str) -> float:
        return statistics.median(self.times[name])

    def ratio(self, slow: str, fast: str) -> float:
        """median(slow) / median(fast): how many times faster ``fast`` is."""
        return self.median(slow) / self.median(fast)

    def paired_ratios(self, slow: str, fast: str) -> list[float]:
        """Per-round ratios slow/fast (round r of each side ran back to back)."""
        return [s / f for s, f in zip(self.times[slow], self.times[fast])]


def alternate(runners: dict[str, Callable[[], object]], rounds: int, *,
              log: Callable[[str], None] | None = print) -> Timed:
    """Run every runner once per round, in the given order, ``rounds`` times; wall-clock
    seconds of each run (``time.perf_counter``)."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    out = Timed({k: [] for k in runners})
    for r in range(rounds):
        for name, fn in runners.items():
            t0 = time.perf_counter()
            out.results[name] = fn()
            dt = time.perf_counter() - t0
            out.times[name].append(dt)
            if log:
                log(f"  round {r + 1}/{rounds}  {name:<28s} {dt:8.2f} s")
    return out


def format_table(headers: list[str], rows: list[list[object]]) -> str:
    """A Markdown table; floats are shown with 2 decimals (3 significant below 0.1)."""
    def cell(v):
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 0.1 and v != 0 else f"{v:.2f}"
        return str(v)
    body = [[cell(v) for v in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in body)) if body else len(h)
              for i, h in enumerate(headers)]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    return "\n".join([line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|",
                      *(line(r) for r in body)])
