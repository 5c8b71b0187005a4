"""benchmarks/bench_slice.py: its slice is made of real cells of the default run (so a grid
change cannot silently empty it), covers every kind the issue names, and its event reader
sums the workers' call seconds per kind."""

from __future__ import annotations

import json

from workflow_support import ROOT, benchmark_script


def test_slice_targets_are_planned_shards_of_the_default_run(default_cfg):
    from safetyrepro.plan import Plan

    bs = benchmark_script("bench_slice")
    plan = Plan(default_cfg)
    planned = {str(plan.layout.shard_path(j.model, j.benchmark, j.config.id, j.seed).relative_to(ROOT))
               for j in plan.jobs("main")}
    targets = bs.targets()
    assert len(targets) == len(set(targets)) and set(targets) <= planned
    assert 0.04 <= len(targets) / len(planned) <= 0.10          # about 5-10% of the cells
    configs = {t.split("/")[4] for t in targets}
    assert {c.split("-")[0] for c in configs} >= {"T1", "T2", "T4"}      # incl. chain of thought
    assert {c.split("-")[1] for c in configs} >= {"greedy", "t0.3", "t0.7"}
    assert {c.split("-")[2] for c in configs} >= {"k0", "k5"}
    assert {c.split("-")[3] for c in configs} == {"freeform", "logprob"}
    assert {t.split("/")[2] for t in targets} == set(default_cfg.models)


def test_call_seconds_sum_the_slices_calls_per_kind(tmp_path):
    bs = benchmark_script("bench_slice")
    ev = tmp_path / ".workers" / "node" / "events.jsonl"
    ev.parent.mkdir(parents=True)
    lines = [{"event": "load", "seconds": 4.0},
             {"event": "call", "label": "gemma3-270m/bbq/T4-greedy-k0-freeform/s0 (main, nf4)", "seconds": 30.0},
             {"event": "call", "label": "gemma3-270m/bbq/T4-t0.7-k0-freeform/s4 (nf4)", "seconds": 0.5},
             {"event": "call", "label": "smollm2-135m/crows_pairs/T1-greedy-k0-logprob/s0 (main, nf4)", "seconds": 2.0},
             {"event": "call", "label": "smollm2-135m/bbq/T1-greedy-k0-freeform/s0 (main, nf4)", "seconds": 9.0}]
    ev.write_text("".join(json.dumps(x) + "\n" for x in lines) + "{cut short")
    per_kind, per_model, load, n = bs.call_seconds(tmp_path)
    assert per_kind == {"freeform_greedy_sampled": 0.0, "cot": 30.5, "five_shot": 0.0, "logprob": 2.0}
    assert per_model["gemma3-270m"] == 30.5 and load == 4.0 and n == 3
