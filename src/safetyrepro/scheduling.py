"""A fix for Snakemake's local scheduler, applied by the workflow's ``onstart`` handler.

Snakemake 9 (checked on 9.x; the same code is discussed upstream in snakemake/snakemake PR
#3744) rate-limits job submission by default (``--max-jobs-per-timespan 100/1s``). Its
scheduler loop arms a one-second ``threading.Timer`` on EVERY pass that selects jobs, and each
timer's wake-up runs another pass, which arms another timer. Every job completion also runs a
pass, so the number of self-renewing timer chains grows with the number of finished jobs, and
each pass walks every ready job (``update_input_sizes`` hashes all their input files). With the
~1,800 cell jobs of the default grid the scheduler itself was measured using a full CPU core
(97% of one core, sampled with /proc over 5 s, 200+ live timer threads after 270 jobs), i.e.
half of this 2-core machine, taken from the model worker.

On a local run the limit protects nothing (jobs start on this machine, one GPU/CPU slot at a
time), so :func:`drop_local_rate_limiter` removes the limiter (the state Snakemake itself uses
for dry-runs): the scheduler then runs one pass per finished job. Cluster executors keep it,
since there it spaces out submissions to the batch system.
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
