"""End-of-run bookkeeping for the workflow: stop this node's model workers, report how many
times each model was loaded and what share of the run's wall time loading took, and (after a
run with failures, e.g. a ``keep-going`` run of ``profiles/paper``) list every failed job with
its error."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

from .sysutil import atomic_write_text
from .worker.events import event_files, format_summary, summarize_events
from .worker.layout import default_state_dir
from .worker.lifecycle import hold_run_lease, stop_run_workers, stop_workers


_ERROR_BLOCK = re.compile(r"^Error in rule (\S+?):?(?:, jobid: \S+)?\s*$")
_FIELD = re.compile(r"^\s+(output|log): (.*?)(?: \(check log file\(s\) for error details\))?\s*$")


def job_error(log_path: str | Path, max_chars: int = 500) -> str:
    """The error a failed job left in its log: the last line starting with ``error:`` (what
    the package's commands print), else the last non-empty line; a missing log says so."""
    p = Path(log_path)
    try:
        lines = [ln.strip() for ln in p.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return f"(no log at {p})"
    if not lines:
        return f"(empty log {p})"
    flagged = [ln for ln in lines if ln.lower().startswith("error:")]
    return (flagged[-1] if flagged else lines[-1])[:max_chars]


def failed_jobs(snakemake_logs) -> list[dict]:
    """Failed jobs named in Snakemake's own log file(s) (the ``log`` an ``onerror`` handler
    receives): one record per ``Error in rule <name>:`` block with the rule, its outputs, its
    log file(s) and the error read from the first log (:func:`job_error`)."""
    if isinstance(snakemake_logs, (str, Path)):
        snakemake_logs = [snakemake_logs]
    failed: list[dict] = []
    seen: set[tuple] = set()
    for log in snakemake_logs or []:
        try:
            text = Path(log).read_text(errors="replace")
        except OSError:
            continue
        current = None
        for line in text.splitlines():
            m = _ERROR_BLOCK.match(line)
            if m:
                current = {"rule": m.group(1), "output": [], "log": []}
                failed.append(current)
                continue
            if current is None:
                continue
            f = _FIELD.match(line)
            if f:
                current[f.group(1)] = [x.strip() for x in f.group(2).split(",") if x.strip()]
            elif line and not line.startswith(" "):
                current = None
    out = []
    for rec in failed:
        key = (rec["rule"], tuple(rec["output"]))
        if key in seen:  # Snakemake may print a block twice (job error and final summary)
            continue
        seen.add(key)
        rec["error"] = job_error(rec["log"][0]) if rec["log"] else "(the job has no log file)"
        out.append(rec)
    return out


def format_failed(failed: list[dict]) -> str:
    lines = [f"failed jobs ({len(failed)}):"]
    for rec in failed:
        what = ", ".join(rec["output"]) or rec["rule"]
        lines.append(f"  {rec['rule']}: {what}")
        lines.append(f"      {rec['error']}")
        if rec["log"]:
            lines.append(f"      log: {', '.join(rec['log'])}")
    return "\n".join(lines)


_LEASE = None  # this run's lease (see worker.lifecycle.hold_run_lease), held until the process ends


def start_run(results_dir, run_id: str) -> None:
    """Take the run's lease on this node's worker state folder, so that another run ending
    meanwhile leaves the workers this run uses alone."""
    global _LEASE
    _LEASE = hold_run_lease(default_state_dir(results_dir), run_id)


def finish_run(results_dir, t0: float, ok: bool = True, snakemake_log=None,
               run_id: str | None = None) -> dict:
    state_dir = default_state_dir(results_dir)
    # stop only the workers no other live run is using (all of them without a run id)
    stopped = stop_run_workers(state_dir, run_id) if run_id else stop_workers(state_dir)
    wall = time.time() - t0
    summary = summarize_events(event_files(results_dir), since=t0, wall_seconds=wall)
    summary["run_ok"] = ok
    summary["workers_stopped"] = stopped
    print("\nmodel loads and loading share of this run's wall time:")
    print(format_summary(summary))
    if not ok:
        summary["failed_jobs"] = failed_jobs(snakemake_log)
        print("\n" + format_failed(summary["failed_jobs"]))
    atomic_write_text(f"{results_dir}/logs/run_summary.json", json.dumps(summary, indent=2, default=str))
    return summary
