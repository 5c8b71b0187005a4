"""End-of-run bookkeeping for the workflow: stop this node's model workers and report how
many times each model was loaded and what share of the run's wall time loading took."""

from __future__ import annotations

import json
import time

from .io import atomic_write_text


def finish_run(results_dir, t0: float, ok: bool = True) -> dict:
    from .worker.client import stop_workers
    from .worker.events import event_files, format_summary, summarize_events
    from .worker.state import default_state_dir

    stopped = stop_workers(default_state_dir(results_dir))
    wall = time.time() - t0
    summary = summarize_events(event_files(results_dir), since=t0, wall_seconds=wall)
    summary["run_ok"] = ok
    summary["workers_stopped"] = stopped
    print("\nmodel loads and loading share of this run's wall time:")
    print(format_summary(summary))
    atomic_write_text(f"{results_dir}/logs/run_summary.json", json.dumps(summary, indent=2, default=str))
    return summary
