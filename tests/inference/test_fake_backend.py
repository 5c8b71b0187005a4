"""`run_cell` on the fake backend (inference/backend.py): the whole cell path (request, items,
prompts, decode group, rows, shard) without a model, for a free-form and a logprob cell."""

from __future__ import annotations

import time

import pytest
import yaml

from safetyrepro.cells import ModelCellRunner, run_cell
from safetyrepro.config import load_config
from safetyrepro.errors import CellError
from safetyrepro.inference.backend import FakeBackend
from safetyrepro.items import build_items
from safetyrepro.plan import Plan
from safetyrepro.shards import SHARD_SCHEMA, read_shard
from workflow_support import DATA, ROOT
from config_support import config_copy

MODEL = "smollm2-135m"


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    d = tmp_path_factory.mktemp("fake")
    cfg = config_copy(ROOT / "config/config.yaml")
    cfg["benchmarks"] = {b: {"n_items": 3} for b in ("bbq", "truthfulqa")}
    cfg["models"] = {MODEL: cfg["models"][MODEL]}
    cfg["data"]["local_dir"] = str(DATA)
    cfg["runtime"].update(results_dir=str(d / "results"), device="cpu")
    path = d / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    p = Plan(load_config(path))
    for b in p.cfg.benchmarks:
        build_items(p.cfg, b)
    return p


def _runner(plan):
    return ModelCellRunner(backend=FakeBackend(MODEL, plan.quantization(MODEL), plan.fingerprints.weights_identity(MODEL)))


@pytest.mark.parametrize("benchmark, config_id", [("bbq", "T1-t0.3-k3-freeform"),
                                                  ("truthfulqa", "T2-greedy-k0-logprob")])
def test_run_cell_on_the_fake_backend_writes_a_real_shard(plan, tmp_path, benchmark, config_id):
    out = tmp_path / "s1.parquet"
    request = plan.cell_request(MODEL, benchmark, config_id, 1 if "t0.3" in config_id else 0, out)
    runner = _runner(plan)
    t0 = time.perf_counter()
    summary = run_cell(request, runner, progress=False)
    assert time.perf_counter() - t0 < 1.0
    table, meta = read_shard(out)
    assert table.schema.equals(SHARD_SCHEMA, check_metadata=False) and table.num_rows == 3 == summary["n_items"]
    assert meta.model_info["backend"] == "fake"
    # the shard carries the fingerprint aggregation expects of the plan's cell
    assert meta.fingerprint == plan.cell_fingerprint(MODEL, benchmark, config_id, request.seed)
    assert meta.decode_group == [list(g) for g in plan.decode_group(benchmark, config_id)]
    rows = table.to_pylist()
    if config_id.endswith("logprob"):
        for r in rows:
            assert r["raw_output"] is None and len(r["cand_logliks"]) >= 2
            assert r["chosen_index"] == max(range(len(r["cand_logliks"])), key=r["cand_logliks"].__getitem__)
    else:
        assert all(r["raw_output"] and r["n_gen_tokens"] >= 1 for r in rows)
        # deterministic: the same cell again gives the same outputs; another seed other ones
        again = tmp_path / "again.parquet"
        run_cell(plan.cell_request(MODEL, benchmark, config_id, 1, again), _runner(plan), progress=False)
        assert read_shard(again)[0].column("raw_output") == table.column("raw_output")
        other = tmp_path / "s0.parquet"
        run_cell(plan.cell_request(MODEL, benchmark, config_id, 0, other), runner, progress=False)
        assert read_shard(other)[0].column("raw_output") != table.column("raw_output")


def test_a_stale_fingerprint_is_refused_on_the_fake_backend(plan, tmp_path):
    from safetyrepro.cells import StaleWorkerError

    out = tmp_path / "x.parquet"
    request = plan.cell_request(MODEL, "bbq", "T1-greedy-k0-logprob", 0, out)
    with pytest.raises(StaleWorkerError, match="job's fingerprint 000000000000 differs"):
        run_cell(request.replace(fingerprint="0" * 64), _runner(plan), progress=False)
    with pytest.raises(CellError, match="this worker holds other"):
        run_cell(request, ModelCellRunner(backend=FakeBackend("other", request.quantization)), progress=False)
    assert not out.exists()


def test_every_cell_of_a_run_on_the_fake_backend_aggregates(plan, tmp_path):
    """All main cells of the run (decode groups served in job order) on one fake runner, then
    aggregation of exactly the shards the plan lists: every shard carries the expected
    fingerprint, and each (model, config) is one row of the cell-score grid."""
    import dataclasses

    from safetyrepro.aggregate import aggregate

    jobs = [j for j in plan.jobs("main") if j.benchmark == "bbq"]
    runner = _runner(plan)
    for j in jobs:
        out = tmp_path / j.config.id / f"s{j.seed}.parquet"
        run_cell(plan.cell_request(j.model, j.benchmark, j.config.id, j.seed, out), runner, progress=False)
    inputs = plan.aggregate_inputs("main")
    listed = {(e.model, e.benchmark, e.config_id, e.seed): e for e in inputs.shards}
    shards = tuple(dataclasses.replace(listed[j.model, j.benchmark, j.config.id, j.seed],
                                       path=str(tmp_path / j.config.id / f"s{j.seed}.parquet")) for j in jobs)
    cells, items, meta = aggregate(plan.cfg, dataclasses.replace(inputs, shards=shards), progress=False)
    assert len(cells) == len({j.config.id for j in jobs}) and meta["n_shards"] == len(jobs)
    assert len(items) == 3 * len(jobs) and set(cells["benchmark"]) == {"bbq"}
    assert not runner._pending                      # every decode group handed out whole
