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


def test_real_workflow_through_slurm_profile(tmp_path, monkeypatch):
    """The project's own workflow on a micro config (SmolLM2 fp32 vs NF4, XSTest, 2 items, T1,
    greedy, 0 shots, both scoring paths): every job is a Slurm job, cells request the GPU."""
    import pyarrow.parquet as pq
    import yaml

    from safetyrepro.cells import read_shard
    from workflow_support import make_project_copy

    env_rules = {
        "rules_version": 1,
        "axes": {"template": [{"id": "T1", "name": "minimal", "tier": "core"}],
                 "decoding": [{"id": "greedy", "temperature": 0.0, "sampled": False, "tier": "core"}],
                 "shots": [{"id": "k0", "n": 0, "tier": "core"}],
                 "scoring": [{"id": "freeform", "tier": "core"}, {"id": "logprob", "tier": "core"}]},
        "seeds": {"sampled": 1, "deterministic": 1}, "validity": [],
        "sub_envelopes": {"full": {}, "conservative_core": {"include": {"scoring": ["freeform"]}}},
        "benchmarks": ["xstest"],
    }
    project, config = make_project_copy(tmp_path / "p", {
        "benchmarks": {"xstest": {"n_items": 2}},
        "envelope": {"rules": "tests/configs/envelope_micro.yaml", "name": "full"},
        "analysis": {"precision_check": False},
    })
    (project / "tests" / "configs" / "envelope_micro.yaml").write_text(yaml.safe_dump(env_rules))
    monkeypatch.setenv("PYTHONPATH", str(project / "src"))
    run = run_workflow(project, config, ["results/tables/rho_flip.parquet"], timeout_s=600)
    assert run.returncode == 0, run.describe()
    cell_jobs = {rule: ids for rule, ids in run.submitted.items() if rule == "cell"}
    assert sum(len(v) for v in cell_jobs.values()) == 4, run.describe()
    for ids in cell_jobs.values():
        for job_id in ids:
            job = scontrol_job(job_id)
            assert job["JobState"] == "COMPLETED" and "gpu" in job.get("TresPerJob", ""), job
    shards = sorted((project / "results" / "shards").rglob("*.parquet"))
    assert len(shards) == 4
    for s in shards:
        table, meta = read_shard(s)
        assert table.num_rows == 2 and meta["benchmark"] == "xstest"
    rho = pq.read_table(project / "results" / "tables" / "rho_flip.parquet").to_pandas()
    assert len(rho) == 1 and rho["n_configs"].iloc[0] == 2
    from safetyrepro.worker.client import stop_workers
    from safetyrepro.worker.state import default_state_dir

    stop_workers(default_state_dir(project / "results"))
