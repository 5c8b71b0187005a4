"""A worker never serves stale code or settings (issue 15): a live worker that loaded the
rules or a task template before an edit does not compute the rerun cell; a fresh worker does,
and the shard records the new rules stamp and prompts. Real Snakemake runs, real model."""

from __future__ import annotations

import json

from workflow_support import cli, make_project_copy, snakemake

from safetyrepro.io import read_parquet
from safetyrepro.rules import load_rules
from safetyrepro.worker.events import read_events
from safetyrepro.worker.state import default_state_dir, pid_alive


def _live_worker(project, config, results, cell):
    """Start a worker the way a killed run or a long idle timeout leaves one: alive after
    its call, with the config, rules and tasks of that moment loaded."""
    out = results / "scratch" / f"{cell}.parquet"
    r = cli(project, "run-cell", "--worker", "--config", str(config), "--model", "smol-fp32",
            "--benchmark", "xstest", "--cell", cell, "--out", str(out))
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
