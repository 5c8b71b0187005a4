"""The Slurm profile on a real cluster: the single-node one that .ci/slurm/up.sh starts.

Runs only in the CI step that started the cluster and set SAFETYREPRO_SLURM=1 (`make test`
deselects the marker; a plain `pytest` run lists it as skipped, with the reason).
"""

import json
import os
import re
import socket
import subprocess
import time

import pytest

from safetyrepro.worker.pidfiles import is_worker_process
from slurm_helpers import (
    SLURM_CLUSTER_ONLY,
    profile_settings,
    read_env_file,
    run_workflow,
    scontrol_epoch,
    scontrol_job,
    start_workflow,
    write_smoke_workflow,
)

pytestmark = SLURM_CLUSTER_ONLY


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
    assert state in {"idle", "mix", "alloc"}, node.stdout  # %t: compact state names
    # two fake GPUs: two group jobs can run at once
    assert gres.startswith("gpu:2"), node.stdout


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


# ---- the project's workflow on the cluster -----------------------------------------------

CELL_MEM_MB = 2500
CELL_MINUTES = 5     # generous: CI's 2 cores are shared, an NF4 load alone can take 90 s
# The tiny config on a micro envelope (T1, greedy, 0 and 3 shots, both scoring paths: 4 cells
# per model on XSTest with 2 items), so a cluster run fits CI's 2 shared cores.
MICRO_ENVELOPE = {
    "rules_version": 1,
    "axes": {"template": [{"id": "T1", "name": "minimal", "tier": "core"}],
             "decoding": [{"id": "greedy", "temperature": 0.0, "sampled": False, "tier": "core"}],
             "shots": [{"id": "k0", "n": 0, "tier": "core"}, {"id": "k3", "n": 3, "tier": "core"}],
             "scoring": [{"id": "freeform", "tier": "core"}, {"id": "logprob", "tier": "core"}]},
    "seeds": {"sampled": 1, "deterministic": 1}, "validity": [],
    "sub_envelopes": {"full": {}, "conservative_core": {"include": {"scoring": ["freeform"]}}},
    "benchmarks": ["xstest"],
}
CELLS_PER_MODEL = 4


def _tiny_project(dest):
    """A copy of the project with the tiny config (2 models = SmolLM2 fp32 and NF4) on the
    micro envelope, and small cluster resources for the 2-CPU CI node."""
    import yaml

    from workflow_support import make_project_copy

    project, config = make_project_copy(dest, {
        "benchmarks": {"xstest": {"n_items": 2}},
        # absolute, so the test's own Plan (imported from the checkout) reads it too
        "envelope": {"rules": str(dest / "tests" / "configs" / "envelope_micro.yaml"),
                     "name": "full"},
        "analysis": {"precision_check": False},
    })
    (project / "tests" / "configs" / "envelope_micro.yaml").write_text(yaml.safe_dump(MICRO_ENVELOPE))
    cfg = yaml.safe_load(config.read_text())
    cfg["runtime"]["cluster"] = {"mem_mb": CELL_MEM_MB, "cell_minutes": CELL_MINUTES}
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return project, config


def _group_jobs(run):
    """{(model, shards folder): [Slurm job ids]} of the cell group jobs a run submitted."""
    out = {}
    for name, ids in run.submitted.items():
        m = re.fullmatch(r"group_cells_(.+)_(shards(?:_bf16)?)_cell", name)
        if m:
            out.setdefault((m.group(1), m.group(2)), []).extend(ids)
    return out


def _events(results):
    from safetyrepro.worker.events import event_files, read_events

    return read_events(event_files(results))[0]


def _shards(results):
    return {p: p.stat().st_mtime_ns for p in sorted(results.glob("shards*/**/*.parquet"))}


def test_tiny_config_runs_in_grouped_jobs_each_owning_its_worker(tmp_path, monkeypatch):
    """The README's cluster command on the tiny config, in two invocations (a resumed run):
    cells run in group jobs (one model and variant each, --group-components 2), each group job
    asks for one GPU, the model's memory and the sum of its cells' minutes, starts exactly one
    worker, which is gone when the job ends; group jobs of different models run at once on
    the two GPUs, each with its own worker; the run ends printing loads per worker key = group
    jobs.

    Why different models necessarily overlap: the first invocation computes 2 of the 4 cells
    of the model whose cells have the highest priority (smol-fp32) and prepares both models,
    so the second starts with every remaining cell ready: 1 group job of that model, 2 of the
    other. It runs with --jobs 2 (the cluster's two GPUs), so Snakemake submits 2 group jobs,
    chosen by priority: the first model's only group and one of the other's. Both fit at once
    (2 GPUs, 2 CPUs) and Slurm starts them at submission. (With 2 groups of each model,
    --jobs 2 would submit the first model's two; without --jobs all four go together in an
    order Snakemake does not fix (a set), and in CI on 2026-12-02 Slurm started the two
    smol-fp32 groups first.)"""
    import pyarrow.parquet as pq

    from safetyrepro.config import load_config
    from safetyrepro.plan import Plan

    project, config = _tiny_project(tmp_path / "p")
    monkeypatch.setenv("PYTHONPATH", str(project / "src"))
    results = project / "results"
    plan = Plan(load_config(config))
    first, other = sorted(plan.cfg.models, key=lambda m: -plan.cell_priority(m))
    assert plan.cell_priority(first) > plan.cell_priority(other)
    group_args = ["--group-components", "cells_{model}_{shards}=2"]

    # 1. two cells of the first model, and the other model prepared
    done_first = [plan.layout.shard_path(j.model, j.benchmark, j.config.id, j.seed)
                  for j in plan.jobs() if j.model == first][:2]
    pre_targets = [str(p.relative_to(project)) for p in done_first]
    pre_targets.append(str(plan.layout.model_marker(other).relative_to(project)))
    pre = run_workflow(project, config, pre_targets + group_args, timeout_s=900)
    assert pre.returncode == 0, pre.describe()
    pre_groups = _group_jobs(pre)
    assert {k: len(v) for k, v in pre_groups.items()} == {(first, "shards"): 1}, pre.describe()
    # read now: the controller forgets a finished job after MinJobAge
    finished = {j: scontrol_job(j) for ids in pre_groups.values() for j in ids}
    before = _shards(results)
    assert sorted(before) == sorted(done_first)

    # 2. the README's command for the rest, on as many jobs at once as the cluster has GPUs
    t0 = time.time()
    run = run_workflow(project, config, ["results/tables/cell_scores.parquet", "--jobs", "2",
                                         *group_args], timeout_s=900)
    wall = time.time() - t0
    assert run.returncode == 0, run.describe()
    # every cell was ready at the start: nothing left to prepare
    assert "prepare_model" not in run.submitted and "items" not in run.submitted, run.describe()

    groups = _group_jobs(run)
    # 2 cells left of the first model, 4 of the other, in groups of 2
    assert {k: len(v) for k, v in groups.items()} == {
        (first, "shards"): 1, (other, "shards"): 2}, run.describe()
    assert "cell" not in run.submitted, "a cell ran outside a group"
    shards = _shards(results)
    assert len(shards) == 2 * CELLS_PER_MODEL
    # the first invocation's shards were not recomputed
    assert {p: shards[p] for p in before} == before

    finished.update({j: scontrol_job(j) for ids in groups.values() for j in ids})
    events = _events(results)
    jobs = {}
    for (model, folder), ids in [*pre_groups.items(), *groups.items()]:
        for job_id in ids:
            job = finished[job_id]
            assert job["JobState"] == "COMPLETED" and job["ExitCode"] == "0:0", job
            # resources of a group job: one GPU, the model's memory, the sum of its cells'
            # minutes
            assert job["TresPerJob"] == "gres:gpu:1", job
            assert job["MinMemoryNode"] == f"{CELL_MEM_MB}M", job
            jobs[job_id] = (model, folder, job)
    n_cells = {j: 0 for j in jobs}
    pids = {}
    for job_id, (model, folder, job) in jobs.items():
        mine = [e for e in events if e.get("allocation") == f"slurm{job_id}"]
        loads = [e for e in mine if e["event"] == "load" and e.get("ok")]
        # exactly one worker, loaded once, for this job's model and variant
        assert len(loads) == 1, (job_id, mine)
        quant = plan.quantization(model, "main")
        assert loads[0]["key"].startswith(f"{model}.{quant}."), loads
        job_pids = {e["pid"] for e in mine}
        assert len(job_pids) == 1, mine
        pid = pids[job_id] = job_pids.pop()
        calls = [e for e in mine if e["event"] == "call"]
        n_cells[job_id] = len(calls)
        assert f"{len(calls) * CELL_MINUTES:02d}:00" in job["TimeLimit"], (job, len(calls))
        # the worker is gone, and it exited before its job ended
        exits = [e for e in mine if e["event"] == "exit"]
        assert len(exits) == 1, mine
        assert exits[0]["t"] <= scontrol_epoch(job["EndTime"]) + 1, (exits, job)
        assert not is_worker_process(pid), f"worker {pid} of job {job_id} still runs"
    assert sum(n_cells.values()) == len(shards)

    # group jobs of the two models ran at the same time, on the two GPUs, each with its own
    # worker (a pid of its own, recorded under its own allocation)
    def span(job_id):
        job = jobs[job_id][2]
        return scontrol_epoch(job["StartTime"]), scontrol_epoch(job["EndTime"])

    across = [(a, b) for a in groups[(first, "shards")] for b in groups[(other, "shards")]
              if span(a)[0] < span(b)[1] and span(b)[0] < span(a)[1]]
    assert across, {j: (m, job["StartTime"], job["EndTime"]) for j, (m, f, job) in jobs.items()}
    for a, b in across:
        assert pids[a] != pids[b]

    # the end-of-run summary (this invocation's events): loads per worker key = its group jobs
    # of that model and variant
    summary = json.loads((results / "logs" / "run_summary.json").read_text())
    loads = {key: e["loads"] for key, e in summary["keys"].items()}
    assert len(loads) == len(groups), (loads, groups)
    for (model, folder), ids in groups.items():
        quant = plan.quantization(model, "main")
        [key] = [k for k in loads if k.startswith(f"{model}.{quant}.")]
        assert loads[key] == len(ids), (loads, groups)
    assert "model loads and loading share" in run.output
    print(f"\ncluster run (tiny config, micro envelope, second invocation): wall {wall:.0f} s; "
          f"group jobs { {f'{m}/{f}': len(v) for (m, f), v in groups.items()} }; "
          f"loads {loads}; overlapping across models {across}")
    scores = pq.read_table(results / "tables" / "cell_scores.parquet")
    assert scores.num_rows > 0


def test_cancelled_group_job_loses_no_shard_and_reruns_its_cells(tmp_path, monkeypatch):
    """scancel of a running group job mid-run: its worker exits with it (the owner watch, no
    cgroups here), the shards it finished stay, and the next invocation runs its missing
    cells (and only those) in new group jobs."""
    project, config = _tiny_project(tmp_path / "p")
    monkeypatch.setenv("PYTHONPATH", str(project / "src"))
    results = project / "results"
    target = ["results/tables/cell_scores.parquet"]
    target += ["--group-components", "cells_{model}_{shards}=4"]
    proc = start_workflow(project, config, target, timeout_s=600)
    victim = None
    try:
        deadline = time.time() + 400
        while victim is None and time.time() < deadline and proc.poll() is None:
            time.sleep(1)
            done = list((results / "shards" / "smol-fp32").rglob("*.parquet"))
            if len(done) >= 1:
                starts = [e for e in _events(results) if e["event"] == "start"
                          and e["key"].startswith("smol-fp32.") and e.get("allocation")]
                if starts:
                    victim = starts[0]
        assert victim is not None, "no smol-fp32 group job finished a cell in time"
        job_id = victim["allocation"].removeprefix("slurm")
        subprocess.run(["scancel", job_id], check=True, timeout=30)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0, out
    before = _shards(results)
    # the cancelled job's worker is gone soon after (it has no cgroup to die with)
    end = time.time() + 60
    while is_worker_process(victim["pid"]) and time.time() < end:
        time.sleep(0.2)
    assert not is_worker_process(victim["pid"]), f"worker {victim['pid']} outlived job {job_id}"
    cancelled = scontrol_job(job_id)
    assert cancelled["JobState"] == "CANCELLED", cancelled
    missing_fp32 = CELLS_PER_MODEL - len([p for p in before if "/smol-fp32/" in str(p)])
    assert missing_fp32 > 0, "the cancelled job had already finished every cell"

    again = run_workflow(project, config, target, timeout_s=600)
    assert again.returncode == 0, again.describe()
    after = _shards(results)
    # nothing finished was lost or recomputed; every cell is there now
    assert {p: after.get(p) for p in before} == before
    assert len(after) == 2 * CELLS_PER_MODEL
    groups = _group_jobs(again)
    assert ("smol-fp32", "shards") in groups, again.describe()
    new_calls = [e for e in _events(results) if e["event"] == "call"
                 and e.get("allocation") in {f"slurm{j}" for j in groups[("smol-fp32", "shards")]}]
    assert len(new_calls) == missing_fp32
