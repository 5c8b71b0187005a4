"""A fix for Snakemake's local scheduler, applied by the workflow's ``onstart`` handler.

Snakemake 9's default job rate limiter (``--max-jobs-per-timespan 100/1s``; snakemake PR
#3744) arms a one-second timer on every scheduler pass, and each timer runs another pass, so
timer chains grow with the finished jobs and each pass rehashes every ready job's inputs: with
the default grid's cell jobs the scheduler takes a CPU core from the model worker
(benchmarks/RESULTS.md, "Numbers from code comments"). On a local run the limit protects
nothing, so :func:`drop_local_rate_limiter` removes it (as Snakemake does for dry-runs);
cluster executors keep it to space out submissions.
"""

from __future__ import annotations

MESSAGE = "scheduler: job rate limiter off for local execution (see safetyrepro.scheduling)"


def drop_local_rate_limiter(workflow) -> bool:
    """Remove the job rate limiter of ``workflow``'s scheduler when jobs run locally; returns
    whether it did. Call from ``onstart`` (the scheduler exists then; no job was selected)."""
    scheduler = getattr(workflow, "scheduler", None)
    if scheduler is None or getattr(scheduler, "job_rate_limiter", None) is None:
        return False
    if not getattr(workflow, "local_exec", False):
        return False
    scheduler.job_rate_limiter = None
    print(MESSAGE, flush=True)
    return True
