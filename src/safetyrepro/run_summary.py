"""End-of-run bookkeeping for the workflow: stop this node's model workers and report how
many times each model was loaded and what share of the run's wall time loading took."""

from __future__ import annotations

import json
import time

from .io import atomic_write_text


_LEASE = None  # this run's lease (see worker.client.hold_run_lease), held until the process ends


def start_run(results_dir, run_id: str) -> None:
    """Take the run's lease on this node's worker state folder, so that another run ending
    meanwhile leaves the workers this run uses alone."""
    global _LEASE
    from .worker.client import hold_run_lease
    from .worker.state import default_state_dir

    _LEASE = hold_run_lease(default_state_dir(results_dir), run_id)


def finish_run(results_dir, t0: float, ok: bool = True, run_id: str | None = None) -> dict:
    from .worker.client import stop_run_workers, stop_workers
    from .worker.events import event_files, format_summary, summarize_events
    from .worker.state import default_state_dir

    state_dir = default_state_dir(results_dir)
    # stop only the workers no other live run is using (all of them without a run id)
    stopped = stop_run_workers(state_dir, run_id) if run_id else stop_workers(state_dir)
    wall = time.time() - t0
    summary = summarize_events(event_files(results_dir), since=t0, wall_seconds=wall)
    summary["run_ok"] = ok
    summary["workers_stopped"] = stopped
    print("\nmodel loads and loading share of this run's wall time:")
    print(format_summary(summary))
    atomic_write_text(f"{results_dir}/logs/run_summary.json", json.dumps(summary, indent=2, default=str))
    return summary
