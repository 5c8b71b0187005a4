"""benchmarks/bench_client_start.py: it times both revisions in both states of their work
trees, records every round, and leaves no work tree behind."""

from __future__ import annotations

import json
import subprocess

from workflow_support import ROOT, benchmark_script


def _worktrees() -> str:
    return subprocess.run(["git", "-C", str(ROOT), "worktree", "list"], capture_output=True, text=True,
                          check=True).stdout


def test_client_start_times_both_revisions_from_source_and_from_bytecode(tmp_path):
    bs = benchmark_script("bench_client_start")
    assert bs.main(["--baseline", "HEAD", "--candidate", "HEAD", "--rounds", "2", "--runs", "2",
                    "--out", str(tmp_path)]) == 0
    rec = json.loads((tmp_path / "client_start.json").read_text())
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    assert rec["baseline_commit"] == rec["candidate_commit"] == head
    for state in bs.STATES:
        for side in ("baseline", "candidate"):
            assert len(rec["times_ms"][state][side]) == 2 and all(t > 0 for t in rec["times_ms"][state][side])
        assert rec["ratio_candidate_over_baseline"][state] > 0 and len(rec["paired_ratios"][state]) == 2
    assert rec["as_run_ratio"] == round(rec["median_ms"]["bytecode"]["candidate"]
                                        / rec["median_ms"]["source"]["baseline"], 3)
    assert rec["machine"]["cores"] >= 1 and "state" in rec["table"]
    assert "bench_client_start." not in _worktrees()
