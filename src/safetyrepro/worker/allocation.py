"""A Slurm job's workers on a node: the allocation id that names their state folder, and the
owner process (the job's first Snakemake process) whose exit ends them. Standard library
only."""

from __future__ import annotations

import os
from pathlib import Path

from ..procs import pid_alive
from ..sysutil import hostname
from .pidfiles import process_start_time


def allocation_id(env: dict[str, str] | None = None) -> str | None:
    """``slurm<jobid>`` inside a Slurm allocation (``SLURM_JOB_ID``; every step and every
    process of a job sees the same value), else None."""
    job = (os.environ if env is None else env).get("SLURM_JOB_ID", "")
    return f"slurm{job}" if job.isdigit() else None


OWNER_ENV = "SAFETYREPRO_JOB_OWNER"


def claim_allocation_owner() -> bool:
    """Inside a Slurm job: make this process the owner of the job's workers on this node,
    unless a live process of the same job and node already is (its claim is inherited in
    ``$SAFETYREPRO_JOB_OWNER``). The first Snakemake process of a group job (the batch step's,
    which runs each cell as a job step of its own) claims it; its job steps and their cell
    clients inherit the claim, and a worker they start exits when the owner is gone. Returns
    whether this process claimed it (and so should stop the job's workers when it exits)."""
    job = os.environ.get("SLURM_JOB_ID", "")
    if not job.isdigit() or not Path("/proc/self").exists():
        return False
    if allocation_owner() is not None:
        return False
    start = process_start_time(os.getpid())
    if start is None:
        return False
    os.environ[OWNER_ENV] = f"{job}:{hostname()}:{os.getpid()}:{start}"
    return True


def allocation_owner() -> str | None:
    """``"PID:START"`` of this job's owner process on this node (see
    :func:`claim_allocation_owner`) if it is alive, else None (also outside Slurm jobs)."""
    job = os.environ.get("SLURM_JOB_ID", "")
    parts = os.environ.get(OWNER_ENV, "").split(":")
    if not job.isdigit() or len(parts) != 4 or parts[0] != job or parts[1] != hostname():
        return None
    owner = f"{parts[2]}:{parts[3]}"
    try:
        return owner if owner_alive(owner) else None
    except ValueError:
        return None


def owner_alive(owner: str) -> bool:
    """Whether the process ``"PID:START"`` (from :func:`allocation_owner`) still runs."""
    pid_s, _, start_s = owner.partition(":")
    pid = int(pid_s)
    return pid_alive(pid) and str(process_start_time(pid)) == start_s
