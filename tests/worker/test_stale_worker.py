"""A worker never serves stale code or settings (issue 15): a live worker that loaded the
rules or a task template before an edit does not compute the rerun cell; a fresh worker does,
and the shard records the new rules stamp and prompts. Real Snakemake runs, real model."""

from __future__ import annotations

import json
import time

import pytest

from workflow_support import cli, make_project_copy, snakemake

from safetyrepro.io import read_parquet
from safetyrepro.rules import load_rules
from safetyrepro.worker.events import read_events
from safetyrepro.procs import pid_alive
from safetyrepro.worker.layout import default_state_dir

pytestmark = pytest.mark.slow


def _live_worker(project, config, results, cell):
    """Start a worker the way a killed run or a long idle timeout leaves one: alive after
    its call, with the config, rules and tasks of that moment loaded."""
    out = results / "scratch" / f"{cell}.parquet"
    r = cli(project, "run-cell", "--worker", "--config", str(config), "--model", "smol-fp32",
            "--benchmark", "xstest", "--config-id", cell, "--out", str(out))
    assert r.returncode == 0, r.stderr
    evs = read_events(default_state_dir(results) / "events.jsonl")[0]
    pid = [e for e in evs if e["event"] == "call"][-1]["pid"]
    assert pid_alive(pid)
    return pid


def test_rules_and_template_edits_with_a_live_worker(tmp_path):
    project, config = make_project_copy(tmp_path / "p")
    results = project / "results"
    shard = results / "shards" / "smol-fp32" / "xstest" / "T1-greedy-k0-freeform" / "s0.parquet"
    target = str(shard.relative_to(project))
    r = snakemake(project, config, target)
    assert r.returncode == 0, r.stdout + r.stderr
    _, meta0 = read_parquet(shard)

    # -- a rules edit (outside the package: the worker's code stamp does not see it)
    stale = _live_worker(project, config, results, "T1-greedy-k3-freeform")
    rules = project / "tests" / "configs" / "envelope_tiny.yaml"
    rules.write_text(rules.read_text().replace("no stress level", "no stress level (edited)"))
    new_stamp = load_rules(rules).stamp
    assert new_stamp != meta0["rules_stamp"]
    r = snakemake(project, config, target)
    assert r.returncode == 0, r.stdout + r.stderr
    _, meta1 = read_parquet(shard)
    assert meta1["rules_stamp"] == new_stamp and meta1["fingerprint"] != meta0["fingerprint"]
    evs = read_events(default_state_dir(results) / "events.jsonl")[0]
    exit_stale = [e for e in evs if e["event"] == "exit" and e["pid"] == stale]
    assert exit_stale and "StaleWorkerError" in exit_stale[0]["reason"]
    served = [e for e in evs if e["event"] == "call" and "T1-greedy-k0-freeform" in (e["label"] or "")]
    assert served[-1]["ok"] and served[-1]["pid"] != stale
    assert not served[-2]["ok"] and served[-2]["pid"] == stale     # refused, nothing computed

    # -- a template edit (a task file of the package)
    _live_worker(project, config, results, "T1-greedy-k3-freeform")
    task = project / "src" / "safetyrepro" / "tasks" / "xstest.yaml"
    text = task.read_text()
    assert text.count('      user: "{prompt}"\n      answer: "{label}"') >= 1
    task.write_text(text.replace('      user: "{prompt}"\n      answer: "{label}"',
                                 '      user: "EDITED {prompt}"\n      answer: "{label}"', 1))
    r = snakemake(project, config, target)
    assert r.returncode == 0, r.stdout + r.stderr
    table, meta2 = read_parquet(shard)
    assert meta2["template_hash"] != meta1["template_hash"]
    assert all("EDITED " in p for p in table.column("prompt").to_pylist())
    summary = json.loads((results / "logs" / "run_summary.json").read_text())
    assert summary["run_ok"] is True


PLANNED = """
import json, sys
from safetyrepro.config import load_config
from safetyrepro.plan import Plan
plan = Plan(load_config(sys.argv[1]))
m, b, c = "smol-fp32", "xstest", "T1-greedy-k0-freeform"
request = plan.cell_request(m, b, c, 0, sys.argv[2])
print(json.dumps({"request": request.as_message(), "key": plan.worker_key(m, request.quantization),
                  "state_root": str(plan.layout.worker_state_root)}))
"""


def test_a_second_mismatch_fails_the_cell_job(tmp_path):
    """A setting in the fingerprint changes after the job was planned (here
    generation.batch_size): the worker refuses and exits, the fresh worker the client starts
    refuses too, and the job fails with an error saying what happened and what to do; no
    shard is written and no worker is left. The same job planned after the edit succeeds."""
    import subprocess
    import sys

    import yaml

    from workflow_support import env_for

    project, config = make_project_copy(tmp_path / "p")
    results = project / "results"
    prep = ["results/items/xstest.parquet", "results/items/xstest.fewshot.parquet",
            "results/models/smol-fp32.json"]
    r = snakemake(project, config, *prep)
    assert r.returncode == 0, r.stdout + r.stderr
    env = dict(env_for(project), SAFETYREPRO_DEVICE_LOCK_DIR=str(tmp_path / "devices"))

    def planned_job():
        out = subprocess.run([sys.executable, "-c", PLANNED, str(config), str(shard)], env=env, cwd=project,
                             capture_output=True, text=True, check=True).stdout
        return json.loads(out)

    shard = results / "shards" / "smol-fp32" / "xstest" / "T1-greedy-k0-freeform" / "s0.parquet"

    def run_job(job):
        from safetyrepro.cell_request import format_decode_group

        req = job["request"]
        args = {"config": req["config_path"], "config-id": req["config_id"], "model": req["model"],
                "variant": req["variant"], "quantization": req["quantization"], "benchmark": req["benchmark"],
                "seed": req["seed"], "decode-group": format_decode_group(req["decode_group"]),
                "rules": req["rules"], "items": req["items"], "fewshot": req["fewshot"],
                "model-marker": req["model_marker"], "fingerprint": req["fingerprint"], "out": req["out"],
                "state-root": job["state_root"], "key": job["key"], "idle-timeout": 60, "timeout": 600,
                "device-wait": 600}
        argv = [a for k, v in args.items() for a in (f"--{k}", str(v))]
        return subprocess.run([sys.executable, "-m", "safetyrepro.cell_client", *argv], env=env, cwd=project,
                              capture_output=True, text=True, timeout=900)

    job = planned_job()
    cfg = yaml.safe_load(config.read_text())
    cfg["generation"]["batch_size"] = 4             # after planning, before the job runs
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    r = run_job(job)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "StaleWorkerError" in r.stderr and f"job's fingerprint {job['request']['fingerprint'][:12]}" in r.stderr
    assert "found the same mismatch after the stale one" in r.stderr and "run the workflow again" in r.stderr
    assert not shard.exists()
    state = default_state_dir(results)
    loads = [e["pid"] for e in read_events(state / "events.jsonl")[0] if e["event"] == "load"]
    assert len(loads) == 2 and loads[0] != loads[1]           # the stale one, one fresh one, no third
    end = time.monotonic() + 60                                # the fresh one exits after answering
    while any(pid_alive(p) for p in loads) and time.monotonic() < end:
        time.sleep(0.1)
    assert not any(pid_alive(p) for p in loads)
    evs = read_events(state / "events.jsonl")[0]
    exits = {e["pid"]: e["reason"] for e in evs if e["event"] == "exit"}
    assert set(exits) == set(loads) and all("StaleWorkerError" in v for v in exits.values())
    assert [e["pid"] for e in evs if e["event"] == "load"] == loads

    r = run_job(planned_job())                         # planned with the edited config
    assert r.returncode == 0, r.stdout + r.stderr
    _, meta = read_parquet(shard)
    assert meta["fingerprint"] != job["request"]["fingerprint"]
