"""The Slurm profile on a real cluster: the single-node one that .ci/slurm/up.sh starts.

Runs only in the CI step that started the cluster and set SAFETYREPRO_SLURM=1 (`make test`
deselects the marker; a plain `pytest` run lists it as skipped, with the reason).
"""

import os
import socket
import subprocess

import pytest

from slurm_helpers import (
    profile_settings,
    read_env_file,
    run_workflow,
    scontrol_job,
    write_smoke_workflow,
)

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(
        os.environ.get("SAFETYREPRO_SLURM") != "1",
        reason="needs the Slurm cluster of .ci/slurm/up.sh and SAFETYREPRO_SLURM=1 "
        "(the separate Slurm step of .ci/run)",
    ),
]


def _time_limit(minutes: int) -> str:
    """Slurm's TimeLimit spelling of a runtime in minutes (under a day)."""
    return f"{minutes // 60:02d}:{minutes % 60:02d}:00"


def test_cluster_is_up():
    node = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%N %t %G"], capture_output=True, text=True, timeout=30
    )
    assert node.returncode == 0, node.stderr
    name, state, gres = node.stdout.split()
    assert name == socket.gethostname().split(".")[0]
    assert state in {"idle", "mixed", "alloc"}, node.stdout
    assert gres.startswith("gpu:1"), node.stdout


def test_smoke_workflow_runs_through_slurm(tmp_path):
    assert "SLURM_JOB_ID" not in os.environ, "run this test outside any Slurm allocation"
    write_smoke_workflow(tmp_path)

    run = run_workflow(tmp_path)
    assert run.returncode == 0, run.describe()

    cpu = read_env_file(tmp_path / "out" / "cpu.txt")
    gpu = read_env_file(tmp_path / "out" / "gpu.txt")

    # Each job ran inside its own Slurm job, and it is the job Snakemake reported submitting.
    assert cpu["SLURM_JOB_ID"].isdigit() and gpu["SLURM_JOB_ID"].isdigit()
    assert cpu["SLURM_JOB_ID"] != gpu["SLURM_JOB_ID"]
    assert run.submitted == {"cpu": [cpu["SLURM_JOB_ID"]], "gpu": [gpu["SLURM_JOB_ID"]]}, (
        run.describe()
    )

    # The controller knows both jobs as completed ones, submitted for the right rules.
    cpu_job = scontrol_job(cpu["SLURM_JOB_ID"])
    gpu_job = scontrol_job(gpu["SLURM_JOB_ID"])
    for rule, job in (("cpu", cpu_job), ("gpu", gpu_job)):
        assert job["JobState"] == "COMPLETED", job
        assert job["ExitCode"] == "0:0", job
        assert job["Comment"] == f"rule_{rule}", job

    # gpu=1 became a GPU request, Slurm allocated the (fake) GPU to the job step, and the
    # job without the resource got none.
    assert gpu_job.get("TresPerJob") == "gres:gpu:1", gpu_job
    assert gpu.get("CUDA_VISIBLE_DEVICES", "") != "", gpu
    assert gpu.get("SLURM_STEP_GPUS", "") != "", gpu
    assert "gpu" not in cpu_job.get("TresPerJob", ""), cpu_job
    assert "CUDA_VISIBLE_DEVICES" not in cpu, cpu

    # Memory and time: the rule's own values for "gpu", the profile's defaults for "cpu".
    defaults = profile_settings()["default-resources"]
    assert cpu_job["MinMemoryNode"] == f"{defaults['mem_mb']}M", cpu_job
    assert cpu_job["TimeLimit"] == _time_limit(defaults["runtime"]), cpu_job
    assert gpu_job["MinMemoryNode"] == "300M", gpu_job
    assert gpu_job["TimeLimit"] == _time_limit(5), gpu_job

    # A second run finds everything up to date and submits nothing.
    again = run_workflow(tmp_path)
    assert again.returncode == 0, again.describe()
    assert again.submitted == {}, again.describe()
    assert "Nothing to be done" in again.output, again.describe()
