"""The run's progress line and its time-left estimate (issue 29)."""

import io
import json
import time

import pytest

from safetyrepro.progress import PlannedCell, RunProgress, estimate_seconds, group_of, kind_of, planned_shards


def test_estimate_costs_decode_groups_not_started_from_the_closest_kind():
    ga, ga2, ga4, gb = ("main", "a", "bbq", "T1", "k0"), ("main", "a", "bbq", "T1", "k3"), \
        ("main", "a", "bbq", "T4", "k0"), ("main", "b", "bbq", "T1", "k0")
    sizes = {ga: 4, ga2: 4, ga4: 2, gb: 2, ("main", "c", "bbq", "T1", "k0"): 2, ("main", "c", "bbq", "T2-greedy-k0-logprob", 0): 1}
    a1, a4, b1 = ("a", "T1", "freeform"), ("a", "T4", "freeform"), ("b", "T1", "freeform")
    done = [(a1, ga, 8.0), (a1, ga, 0.1),          # a T1 k0: the group leader decoded all 4 cells
            (a1, ga2, 4.0),                         # a T1 k3: 1 per cell
            (a4, ga4, 12.0),                        # a T4: 6 per cell
            (b1, gb, 12.0)]                         # b T1: 6 per cell
    assert estimate_seconds([], [(a1, ga)], sizes) is None
    # a cell of a started group costs nothing more; a new a T1 group of 4: mean rate (2.025+1) x 4
    assert estimate_seconds(done, [(a1, ga), (a1, ga2)], sizes) == 0.0
    new = ("main", "a", "truthfulqa", "T1", "k0")
    sizes[new] = 4
    assert estimate_seconds(done, [(a1, new)] * 4, sizes) == pytest.approx(4 * (8.1 / 4 + 1.0) / 2)
    # b has no T4 group yet: its own rate (6) times how T4 compares overall
    overall = (8.1 / 4 + 1.0 + 6.0 + 6.0) / 4
    gb4 = ("main", "b", "bbq", "T4", "k0")
    assert estimate_seconds(done, [(("b", "T4", "freeform"), gb4)], sizes) == pytest.approx(6.0 * 6.0 / overall)
    # a model not started yet: the kind's rate over the models that ran it
    gc = ("main", "c", "bbq", "T1", "k0")
    assert estimate_seconds(done, [(("c", "T1", "freeform"), gc)], sizes) == pytest.approx((8.1 / 4 + 1.0 + 6.0) / 3)
    # nothing like it: the overall rate
    gl = ("main", "c", "bbq", "T2-greedy-k0-logprob", 0)
    assert estimate_seconds(done, [(("c", "T2", "logprob"), gl)], sizes) == pytest.approx(overall)
    assert kind_of("m", "T4-t0.7-k5-freeform") == ("m", "T4", "freeform")
    assert group_of("main", "m", "bbq", "T4-t0.7-k5-freeform", 3) == group_of("main", "m", "bbq", "T4-greedy-k5-freeform", 0)
    assert group_of("main", "m", "bbq", "T4-greedy-k5-logprob", 0) != group_of("bf16", "m", "bbq", "T4-greedy-k5-logprob", 0)


def _event(path, label, t_start, seconds):
    rec = {"event": "call", "key": "k", "pid": 1, "host": "h", "label": label, "t_start": t_start,
           "t": t_start + seconds, "seconds": seconds, "ok": True}
    with open(path, "a") as fh:
        fh.write(json.dumps(rec) + "\n")


def test_line_counts_only_this_runs_cells_and_estimates_the_rest(tmp_path):
    results = tmp_path / "results"
    events = results / ".workers" / "node" / "events.jsonl"
    events.parent.mkdir(parents=True)
    shards = [PlannedCell(results / f"s{i}.parquet", "m", "truthfulqa", cfg, 0) for i, cfg in
              enumerate(["T1-greedy-k0-freeform", "T1-greedy-k3-freeform", "T4-greedy-k0-freeform",
                         "T1-greedy-k5-freeform"])]
    shards[3][0].write_bytes(b"x")          # done before this run: not counted
    prog = RunProgress(results, shards, stream=io.StringIO())
    assert "cells 0 of 3 (0%)" in prog.line() and "estimated once cells are done" in prog.line()
    t = prog.t0 + 1
    shards[0][0].write_bytes(b"x")
    shards[1][0].write_bytes(b"x")
    # two 60 s calls with 36 s of hand-off between them: 18 s per job
    _event(events, "m/truthfulqa/T1-greedy-k0-freeform/s0 (main, nf4)", t, 60.0)
    _event(events, "m/truthfulqa/T1-greedy-k3-freeform/s0 (main, nf4)", t + 96, 60.0)
    line = prog.line(now=t + 156.0)
    assert "cells 2 of 3 (67%)" in line
    # left: the T4 group (no T4 seen: the model's rate, 60 s) + 18 s hand-off = 78 s
    assert "about 1.3 min of cells left" in line and "not started" not in line, line
    # 30 s later those 30 s were spent on it
    assert "about 0.8 min of cells left" in prog.line(now=t + 186.0)
    # an event from before the run started is not this run's
    _event(events, "m/truthfulqa/T4-greedy-k0-freeform/s0 (main, nf4)", prog.t0 - 100, 1000.0)
    assert "about 1.3 min of cells left" in prog.line(now=t + 156.0)


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
    prog = RunProgress(tmp_path, [PlannedCell(p, "m", "bbq", "T1-greedy-k0-freeform", 0, "main", "new")
                                  for p in (current, stale, tmp_path / "garbled.parquet")])
    assert "cells 0 of 2 (0%)" in prog.line()
    shard(stale, "new")   # the workflow rewrites it
    assert "cells 1 of 2 (50%)" in prog.line()


def test_nothing_to_do_prints_nothing(tmp_path):
    p = tmp_path / "done.parquet"
    p.write_bytes(b"x")
    out = io.StringIO()
    prog = RunProgress(tmp_path, [PlannedCell(p, "m", "bbq", "T1-greedy-k0-freeform", 0)], every=0.01,
                       stream=out).start()
    time.sleep(0.05)
    prog.stop()
    assert prog.line() is None and out.getvalue() == ""


def test_planned_shards_cover_every_cell_of_the_run(default_cfg):
    from safetyrepro.plan import Plan

    plan = Plan(default_cfg)
    shards = planned_shards(plan)
    n = len(plan.jobs("main")) + (len(plan.jobs("bf16")) if plan.precision_check else 0)
    assert len(shards) == n == len({p for p, *_ in shards})
    assert all(str(c.path).startswith(str(plan.layout.results)) for c in shards)
    j = plan.jobs("main")[0]
    assert shards[0].fingerprint == plan.cell_fingerprint(j.model, j.benchmark, j.config.id, j.seed)
    # the groups counted are the plan's decode groups
    c = next(c for c in shards if c.config_id.endswith("freeform"))
    size = sum(n for _, n in plan.decode_group(c.benchmark, c.config_id, c.variant))
    assert sum(group_of(*x[5:6], *x[1:5]) == group_of(c.variant, c.model, c.benchmark, c.config_id, c.seed)
               for x in shards) == size


def test_line_names_the_models_not_started_yet(tmp_path):
    """A model with no cell done is costed at the other models' rates: the line says which."""
    results = tmp_path / "results"
    events = results / ".workers" / "node" / "events.jsonl"
    events.parent.mkdir(parents=True)
    shards = [PlannedCell(results / f"{m}{i}.parquet", m, "bbq", cfg, 0)
              for m in ("small", "big", "mid") for i, cfg in
              enumerate(["T1-greedy-k0-logprob", "T2-greedy-k0-logprob"])]
    prog = RunProgress(results, shards, stream=io.StringIO())
    t = prog.t0 + 1
    shards[0][0].write_bytes(b"x")
    _event(events, "small/bbq/T1-greedy-k0-logprob/s0 (main, nf4)", t, 10.0)
    line = prog.line(now=t + 10.0)
    assert "cells 1 of 6" in line and line.endswith("not started yet: big, mid (costed at the rates "
                                                   "of the models done so far)"), line
    for i, (m, cfg) in enumerate([("big", "T1"), ("mid", "T1")]):
        _event(events, f"{m}/bbq/{cfg}-greedy-k0-logprob/s0 (main, nf4)", t + 20 * (i + 1), 10.0)
    assert "not started" not in prog.line(now=t + 60.0)
