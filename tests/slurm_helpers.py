"""Run a Snakemake workflow through the repository's Slurm profile, and ask Slurm about its jobs.

Used by the tests marked ``slurm``, which run only in the CI step that has started the
single-node cluster with ``.ci/slurm/up.sh`` (and set ``SAFETYREPRO_SLURM=1``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import pytest
import yaml

# Every Slurm test module's pytestmark: marked slurm (deselected by `make test`), and run only
# where the CI step has started the cluster and set SAFETYREPRO_SLURM=1.
SLURM_CLUSTER_ONLY = [
    pytest.mark.slurm,
    pytest.mark.skipif(
        os.environ.get("SAFETYREPRO_SLURM") != "1",
        reason="needs the Slurm cluster of .ci/slurm/up.sh and SAFETYREPRO_SLURM=1 "
        "(the separate Slurm step of .ci/run)",
    ),
]

REPO_ROOT = Path(__file__).resolve().parents[1]
PROFILES = REPO_ROOT / "profiles"
SLURM_PROFILE = PROFILES / "slurm"

# The plugin's submission message, e.g.
# "Job 1 has been submitted with SLURM jobid 2 (log: /w/.snakemake/slurm_logs/rule_cpu/2.log)."
# A group job's log folder is group_<group>_<rules>, e.g. group_cells_m_shards_cell.
_SUBMITTED = re.compile(
    r"Job \S+ has been submitted with SLURM jobid (\d+) \(log: [^)]*/slurm_logs/"
    r"(rule_[^/]+|group_[^/]+)/"
)

# A two-rule workflow: "gpu" consumes the output of "cpu", declares gpu=1 and its own memory;
# "cpu" declares nothing and so gets the profile's default-resources. Each job records the
# Slurm variables it saw (grep fails the job if not even SLURM_JOB_ID is set).
SMOKE_SNAKEFILE = """\
rule all:
    input:
        "out/cpu.txt",
        "out/gpu.txt",


rule cpu:
    output:
        "out/cpu.txt",
    shell:
        "env | grep -E '^(SLURM_JOB_ID|CUDA_VISIBLE_DEVICES|SLURM_STEP_GPUS)=' | sort > {output}"


rule gpu:
    input:
        "out/cpu.txt",
    output:
        "out/gpu.txt",
    resources:
        gpu=1,
        mem_mb=300,
        runtime=5,
    shell:
        "env | grep -E '^(SLURM_JOB_ID|CUDA_VISIBLE_DEVICES|SLURM_STEP_GPUS)=' | sort > {output}"
"""


def write_smoke_workflow(directory: Path) -> Path:
    """Write the two-rule smoke workflow into ``directory``; returns the Snakefile's path."""
    directory.mkdir(parents=True, exist_ok=True)
    snakefile = directory / "Snakefile"
    snakefile.write_text(SMOKE_SNAKEFILE)
    return snakefile


def read_env_file(path: Path) -> dict[str, str]:
    """Parse the KEY=VALUE lines a smoke job wrote."""
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    return {key: value for key, value in pairs}


def profile_settings(profile: Path = SLURM_PROFILE) -> dict:
    """The profile's config.yaml as a dict."""
    return yaml.safe_load((profile / "config.yaml").read_text())


@dataclass
class WorkflowRun:
    """Outcome of one Snakemake invocation."""

    command: list[str]
    returncode: int
    output: str
    # rule name -> Slurm job ids, in submission order, as the plugin reported them
    submitted: dict[str, list[str]] = field(default_factory=dict)

    def describe(self, tail_lines: int = 80) -> str:
        tail = "\n".join(self.output.splitlines()[-tail_lines:])
        return f"$ {' '.join(self.command)}\n(exit {self.returncode})\n{tail}"


def _submission_env() -> dict[str, str]:
    # Outside any allocation, with no GPU of its own: whatever Slurm variables or GPU
    # visibility the jobs show must come from Slurm, not from this process (the plugin submits
    # with --export=ALL).
    drop = ("SLURM_", "SBATCH_", "SRUN_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def run_workflow(
    workdir: Path,
    configfile: Path | None = None,
    extra_args: Sequence[str] = (),
    *,
    snakefile: Path | None = None,
    profile: Path = SLURM_PROFILE,
    timeout_s: int = 300,
    status_check_s: int = 8,
) -> WorkflowRun:
    """Run Snakemake in ``workdir`` (its Snakefile, or ``snakefile``) through ``profile``.

    The whole run is bounded by ``timeout -k 10 <timeout_s>`` (a stuck status poll must fail
    CI, not hang it). ``status_check_s`` shortens the plugin's first status-check delay (40 s
    by default; each check that finds no finished job adds 10 s) so small CI workflows finish
    quickly: a trivial job takes ~5 s here (two Snakemake start-ups, sbatch and srun), so 8 s
    usually catches it on the first check. It stays well under a third of Slurm's MinJobAge
    (3600 s in .ci/slurm/up.sh), which squeue polling requires. Successful jobs' Slurm logs
    are kept under ``workdir/.snakemake/slurm_logs`` for inspection.
    """
    command = snakemake_command(workdir, configfile, extra_args, snakefile=snakefile,
                                profile=profile, timeout_s=timeout_s,
                                status_check_s=status_check_s)
    proc = subprocess.run(
        command,
        cwd=workdir,
        env=_submission_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout_s + 30,
    )
    return WorkflowRun(command, proc.returncode, proc.stdout, parse_submitted(proc.stdout))


def start_workflow(workdir: Path, configfile: Path | None = None, extra_args: Sequence[str] = (),
                   *, timeout_s: int = 300, status_check_s: int = 8) -> subprocess.Popen:
    """:func:`run_workflow` in the background (stdout+stderr piped, text)."""
    command = snakemake_command(workdir, configfile, extra_args, timeout_s=timeout_s,
                                status_check_s=status_check_s)
    return subprocess.Popen(command, cwd=workdir, env=_submission_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def snakemake_command(
    workdir: Path,
    configfile: Path | None = None,
    extra_args: Sequence[str] = (),
    *,
    snakefile: Path | None = None,
    profile: Path = SLURM_PROFILE,
    timeout_s: int = 300,
    status_check_s: int = 8,
) -> list[str]:
    """The README's cluster command (``snakemake --profile profiles/slurm --workflow-profile
    none ... --configfile``) for ``workdir``, bounded by ``timeout``."""
    command = [
        # --foreground keeps timeout (and Snakemake) in pytest's process group, so stopping
        # the CI step's pytest also stops this run (Snakemake then cancels its Slurm jobs).
        "timeout", "--foreground", "-k", "10", str(timeout_s),
        sys.executable, "-m", "snakemake",
        "--profile", str(profile),
        # a workflow's profiles/default (the local profile) is otherwise loaded as well and
        # its `executor: local` wins: cluster runs skip it
        "--workflow-profile", "none",
        "--directory", str(workdir),
        "--slurm-init-seconds-before-status-checks", str(status_check_s),
        "--slurm-keep-successful-logs",
    ]
    if snakefile is not None:
        command += ["--snakefile", str(snakefile)]
    # targets/extra args before --configfile, which takes every following word as a file
    command += list(extra_args)
    if configfile is not None:
        command += ["--configfile", str(configfile)]
    return command


def parse_submitted(output: str) -> dict[str, list[str]]:
    """Slurm job ids by rule (``cpu``) or group job (``group_cells_m_shards_cell``), in
    submission order, from Snakemake's output."""
    submitted: dict[str, list[str]] = {}
    for job_id, name in _SUBMITTED.findall(output):
        name = name[len("rule_"):] if name.startswith("rule_") else name
        submitted.setdefault(name, []).append(job_id)
    return submitted


def scontrol_job(job_id: str) -> dict[str, str]:
    """``scontrol show job`` as a dict (the controller keeps finished jobs for MinJobAge)."""
    proc = subprocess.run(
        ["scontrol", "--oneliner", "show", "job", job_id],
        capture_output=True, text=True, timeout=30,
    )
    if proc.returncode != 0:
        raise AssertionError(f"scontrol does not know job {job_id}: {proc.stderr.strip()}")
    fields: dict[str, str] = {}
    for token in proc.stdout.split():
        key, sep, value = token.partition("=")
        if sep:
            fields[key] = value
    return fields


def scontrol_epoch(value: str) -> float:
    """An scontrol time (``2026-12-02T07:36:40``, this machine's local time) in epoch s."""
    import time
    from datetime import datetime

    return time.mktime(datetime.fromisoformat(value).timetuple())
