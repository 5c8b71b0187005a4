"""The run's progress line and its time-left estimate (issue 29)."""

import io
import json
import time

import pytest

from safetyrepro.progress import RunProgress, estimate_seconds, kind_of, planned_shards


def test_estimate_uses_the_closest_done_cells():
    done = [(("a", "T1", "freeform"), 2.0), (("a", "T1", "freeform"), 4.0),   # a T1: mean 3
            (("a", "T4", "freeform"), 12.0),                                    # a T4: 12
            (("b", "T1", "freeform"), 9.0)]                                     # b: 3x slower on T1
    assert estimate_seconds([], [("a", "T1", "freeform")]) is None
    assert estimate_seconds(done, [("a", "T1", "freeform")]) == pytest.approx(3.0)
    # b has no T4 cell yet: its own mean (9) times how T4 compares overall (12 / 6.75)
    assert estimate_seconds(done, [("b", "T4", "freeform")]) == pytest.approx(9.0 * 12.0 / 6.75)
    # a model not started yet: the kind's mean over the models that ran it
    assert estimate_seconds(done, [("c", "T1", "freeform")]) == pytest.approx((2 + 4 + 9) / 3)
    # nothing like it: the overall mean
    assert estimate_seconds(done, [("c", "T2", "logprob")]) == pytest.approx(6.75)
    assert kind_of("m", "T4-t0.7-k5-freeform") == ("m", "T4", "freeform")


def _event(path, label, t_start, seconds):
    rec = {"event": "call", "key": "k", "pid": 1, "host": "h", "label": label, "t_start": t_start,
           "t": t_start + seconds, "seconds": seconds, "ok": True}
    with open(path, "a") as fh:
        fh.write(json.dumps(rec) + "\n")


def test_line_counts_only_this_runs_cells_and_estimates_the_rest(tmp_path):
    results = tmp_path / "results"
    events = results / ".workers" / "node" / "events.jsonl"
    events.parent.mkdir(parents=True)
    shards = [(results / f"s{i}.parquet", "m", cfg) for i, cfg in
              enumerate(["T1-greedy-k0-freeform", "T1-greedy-k3-freeform", "T4-greedy-k0-freeform",
                         "T1-greedy-k5-freeform"])]
    shards[3][0].write_bytes(b"x")          # done before this run: not counted
    prog = RunProgress(results, shards, stream=io.StringIO())
    assert "cells 0 of 3 (0%)" in prog.line() and "estimated once cells are done" in prog.line()
    t = prog.t0 + 1
    shards[0][0].write_bytes(b"x")
    _event(events, "m/truthfulqa/T1-greedy-k0-freeform/s0 (main, nf4)", t, 10.0)
    line = prog.line(now=t + 20.0)           # 20 s wall for 10 s of calls: overhead factor 2
    assert "cells 1 of 3 (33%)" in line
    # left: one T1 cell (10 s) and one T4 cell (no T4 seen: the model's mean, 10 s), times 2
    assert "about 0.7 min left" in line, line
    # an event from before the run started is not this run's
    _event(events, "m/truthfulqa/T1-greedy-k3-freeform/s0 (main, nf4)", prog.t0 - 100, 1000.0)
    assert "about 0.7 min left" in prog.line(now=t + 20.0)


def test_a_stale_shard_counts_as_a_cell_to_compute(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    def shard(path, fingerprint):
        table = pa.table({"x": [1]}).replace_schema_metadata({"safetyrepro": json.dumps({"fingerprint": fingerprint})})
        pq.write_table(table, path)

    current, stale = tmp_path / "current.parquet", tmp_path / "stale.parquet"
    shard(current, "new")
    shard(stale, "old")
    (tmp_path / "garbled.parquet").write_bytes(b"not parquet")
    time.sleep(1.1)     # both written well before the run starts
    prog = RunProgress(tmp_path, [(current, "m", "T1-greedy-k0-freeform", "new"),
                                  (stale, "m", "T1-greedy-k0-freeform", "new"),
                                  (tmp_path / "garbled.parquet", "m", "T1-greedy-k0-freeform", "new")])
    assert "cells 0 of 2 (0%)" in prog.line()
    shard(stale, "new")   # the workflow rewrites it
    assert "cells 1 of 2 (50%)" in prog.line()


def test_nothing_to_do_prints_nothing(tmp_path):
    p = tmp_path / "done.parquet"
    p.write_bytes(b"x")
    out = io.StringIO()
    prog = RunProgress(tmp_path, [(p, "m", "T1-greedy-k0-freeform")], every=0.01, stream=out).start()
    time.sleep(0.05)
    prog.stop()
    assert prog.line() is None and out.getvalue() == ""


def test_planned_shards_cover_every_cell_of_the_run(default_cfg):
    from safetyrepro.plan import Plan

    plan = Plan(default_cfg)
    shards = planned_shards(plan)
    n = len(plan.jobs("main")) + (len(plan.jobs("bf16")) if plan.precision_check else 0)
    assert len(shards) == n == len({p for p, *_ in shards})
    assert all(str(p).startswith(str(plan.layout.results)) for p, *_ in shards)
    p, m, c, fp = shards[0]
    j = plan.jobs("main")[0]
    assert fp == plan.cell_fingerprint(j.model, j.benchmark, j.config.id, j.seed)
