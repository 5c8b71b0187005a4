"""Aggregation on synthetic shards (written with the shards module; no model runs): seed
means, the re-parse of raw outputs, the variant, and the refusals (missing, stale, mixed
rules stamps or item subsets, old metadata), each naming the shards."""

from __future__ import annotations

import pytest

from safetyrepro.aggregate import aggregate
from safetyrepro.errors import ShardError
from safetyrepro.shards import read_shard
from shard_synth import items_of, synthetic_run, write_all, write_cell


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return synthetic_run(tmp_path_factory.mktemp("agg"))


@pytest.fixture
def fresh(run):
    """Every main shard written afresh, all answers correct."""
    write_all(run, "main")
    return run


def _cells(plan, variant="main"):
    cells, items, meta = aggregate(plan.cfg, plan.aggregate_inputs(variant), progress=False)
    return cells.set_index(["model", "config"]), items, meta


def test_sampled_cell_score_is_the_mean_over_seeds(fresh):
    plan = fresh
    n = len(items_of(plan, "truthfulqa")[0])
    write_cell(plan, "m-nf4", "truthfulqa", "T1-t0.7-k0-freeform", 0, n_correct=n)       # 1.0
    write_cell(plan, "m-nf4", "truthfulqa", "T1-t0.7-k0-freeform", 1, n_correct=n // 2)  # 0.5
    write_cell(plan, "m-nf4", "truthfulqa", "T1-greedy-k3-logprob", 0, n_correct=1)
    cells, items, meta = _cells(plan)
    row = cells.loc[("m-nf4", "T1-t0.7-k0-freeform")]
    assert row["n_seeds"] == 2 and list(row["seed_scores"]) == [1.0, (n // 2) / n]
    assert row["score"] == pytest.approx((1.0 + (n // 2) / n) / 2)
    assert row["score_sd"] > 0 and row["parse_rate"] == 1.0
    assert cells.loc[("m-nf4", "T1-greedy-k3-logprob"), "score"] == pytest.approx(1 / n)
    assert cells.loc[("m-nf4", "T1-greedy-k3-logprob"), "n_seeds"] == 1
    assert len(cells) == len({(j.model, j.config.id) for j in plan.jobs("main")})
    assert meta["n_shards"] == len(plan.jobs("main")) and meta["variant"] == "main"
    assert len(items) == len(plan.jobs("main")) * n
    assert set(cells["quantization"]) == {"nf4", "bf16"}


def test_raw_outputs_are_reparsed_not_the_write_time_label(fresh):
    plan = fresh
    path = write_cell(plan, "m-bf16", "truthfulqa", "T4-greedy-k0-freeform", 0, n_correct=0,
                      parser_version="an-old-parser")
    table, meta = read_shard(path)
    assert meta.parser_version == "an-old-parser" and not any(table.column("correct").to_pylist())
    cells, _, _ = _cells(plan)
    assert cells.loc[("m-bf16", "T4-greedy-k0-freeform"), "score"] == 0.0
    # the same outputs with the write-time columns claiming success still score 0
    from safetyrepro.shards import write_shard

    write_shard(path, [dict(r, correct=True) for r in table.to_pylist()], meta)
    cells, _, _ = _cells(plan)
    assert cells.loc[("m-bf16", "T4-greedy-k0-freeform"), "score"] == 0.0


def test_bf16_variant_reads_only_the_precision_check_shards(fresh):
    plan = fresh
    assert plan.precision_check
    write_all(plan, "bf16", n_correct=lambda j: 1)
    cells, _, meta = _cells(plan, "bf16")
    assert meta["variant"] == "bf16" and meta["n_shards"] == len(plan.jobs("bf16")) == 4
    assert set(cells.index.get_level_values("config")) == {"T1-greedy-k0-freeform", "T1-greedy-k3-freeform"}
    assert set(cells["quantization"]) == {"bf16"}
    n = len(items_of(plan, "truthfulqa")[0])
    assert (cells["score"] == 1 / n).all()
    assert all("shards_bf16/" in p for p in meta["shard_fingerprints"])


def test_missing_stale_and_old_shards_are_listed(fresh):
    plan = fresh
    missing = plan.layout.shard_path("m-nf4", "truthfulqa", "T1-greedy-k0-freeform", 0)
    missing.unlink()
    # written for the bf16 variant's fingerprint (a one-stream decode group) into main's place
    stale = write_cell(plan, "m-bf16", "truthfulqa", "T1-greedy-k0-freeform", 0,
                       fingerprint=plan.cell_fingerprint("m-bf16", "truthfulqa", "T1-greedy-k0-freeform", 0, "bf16"))
    old = write_cell(plan, "m-nf4", "truthfulqa", "T4-greedy-k0-freeform", 0)
    from safetyrepro.io import read_parquet, write_parquet

    table, raw = read_parquet(old)
    del raw["variant"]
    write_parquet(table, old, raw)
    with pytest.raises(ShardError) as err:
        aggregate(plan.cfg, plan.aggregate_inputs("main"), progress=False)
    text = str(err.value)
    assert text.startswith("3 shard(s) missing, corrupt or stale")
    assert str(missing) in text and f"{stale}: stale" in text
    assert f"{old}: metadata lacks field(s) variant" in text


def test_mixed_rules_stamps_and_item_subsets_are_refused(fresh):
    plan = fresh
    odd = write_cell(plan, "m-nf4", "truthfulqa", "T1-greedy-k0-freeform", 0, rules_stamp="other-stamp")
    with pytest.raises(ShardError, match="different rules stamps") as err:
        aggregate(plan.cfg, plan.aggregate_inputs("main"), progress=False)
    assert "other-stamp: 1 shard(s), e.g. " + str(odd) in str(err.value)
    write_all(plan, "main")
    odd = write_cell(plan, "m-nf4", "truthfulqa", "T1-greedy-k0-freeform", 0, subset_hash="other-subset")
    with pytest.raises(ShardError, match="item-subset hashes for truthfulqa"):
        aggregate(plan.cfg, plan.aggregate_inputs("main"), progress=False)


def test_a_shard_row_for_an_unknown_item_is_named(fresh):
    plan = fresh
    path = plan.layout.shard_path("m-nf4", "truthfulqa", "T1-greedy-k0-freeform", 0)
    table, meta = read_shard(path)
    from safetyrepro.shards import write_shard

    rows = table.to_pylist()
    rows[0]["item_id"] = "no-such-item"
    write_shard(path, rows, meta)
    with pytest.raises(ShardError, match=f"{path}: item no-such-item is not in"):
        aggregate(plan.cfg, plan.aggregate_inputs("main"), progress=False)


def test_write_aggregate_writes_the_declared_outputs_with_provenance(fresh, tmp_path):
    import json

    from safetyrepro.aggregate import write_aggregate
    from safetyrepro.results_layout import aggregate_outputs
    from safetyrepro.provenance import code_version, format_code_version

    plan = fresh
    plan_rec = {"what": "generation", "batch_size_cap": 8, "batches": [{"prompts": 5}, {"prompts": 3}]}
    split = {"what": "generation", "batch_size": 5, "first_item": 0, "into": [3, 2], "error": "oom"}
    write_cell(plan, "m-nf4", "truthfulqa", "T1-greedy-k0-freeform", 0, code_version=code_version(),
               batching={"oom_splits": [split], "plans": [plan_rec]},
               model_info={"weights_hash": "synthetic", "dtype": "float32", "torch_version": "9.9"})
    with pytest.raises(ShardError, match="different dtype"):  # the other m-nf4 shards record none
        write_aggregate(plan.cfg, plan.aggregate_inputs("main"), tmp_path)
    # the same weights in another arithmetic (float32 where the CPU has no bf16) are not mixed either
    write_all(plan)
    write_cell(plan, "m-nf4", "truthfulqa", "T1-greedy-k0-freeform", 0, code_version=code_version(),
               model_info={"compute_dtype": "float32"})
    with pytest.raises(ShardError, match="different compute_dtype"):
        write_aggregate(plan.cfg, plan.aggregate_inputs("main"), tmp_path)
    write_all(plan)
    write_cell(plan, "m-nf4", "truthfulqa", "T1-greedy-k0-freeform", 0, code_version=code_version(),
               batching={"oom_splits": [split], "plans": [plan_rec]})
    paths = write_aggregate(plan.cfg, plan.aggregate_inputs("main"), tmp_path)
    assert paths == {k: str(v) for k, v in aggregate_outputs(tmp_path, "main").items()}
    assert all((tmp_path / p).exists() for p in paths.values())
    prov = json.loads((tmp_path / "provenance.json").read_text())
    rec = prov["m-nf4"]["truthfulqa"]
    assert rec["quantization"] == "nf4" and rec["weights_hash"] == "synthetic"
    # what the GRID card discloses besides: chat template, numerics, the batch plans and OOM splits
    assert "chat_template_hash" in rec and rec["chat_template_hash"] is None  # synthetic shards: none
    assert rec["numerics"] == {f: None for f in ("dtype", "compute_dtype", "nf4_matmul", "attention", "linear",
                                                 "torch_version", "transformers_version", "bitsandbytes_version")}
    assert rec["batching"] == {"batch_size_caps": [8], "largest_batch_prompts": 5, "memory_plans": 1,
                               "oom_splits": 1}
    # one code version per distinct record: the synthetic shards' empty one and the current one
    assert format_code_version(code_version()) in rec["code_version"].split(", ")
    assert set(prov) == {"m-nf4", "m-bf16"}
    write_all(plan, "bf16")
    assert write_aggregate(plan.cfg, plan.aggregate_inputs("bf16"), tmp_path) == {
        "cell_scores": str(tmp_path / "cell_scores_bf16.parquet"),
                                                       "item_results": str(tmp_path / "item_results_bf16.parquet")}


def test_aggregation_reads_exactly_the_listed_shards_and_items(fresh, tmp_path):
    """The job's input list (as the workflow writes it) round-trips, and aggregation reads the
    files it names, not the plan's: a list naming a shard elsewhere reads that one."""
    import dataclasses
    import shutil

    from safetyrepro.aggregate_inputs import read_inputs, write_inputs

    plan = fresh
    inputs = plan.aggregate_inputs("main")
    write_inputs(tmp_path / "inputs.json", inputs)
    assert read_inputs(tmp_path / "inputs.json") == inputs
    (tmp_path / "bad.json").write_text('{"variant": "main"}')
    with pytest.raises(ShardError, match="not an aggregation input list"):
        read_inputs(tmp_path / "bad.json")
    first = inputs.shards[0]
    moved = tmp_path / "elsewhere.parquet"
    shutil.copy(first.path, moved)
    listed = dataclasses.replace(inputs, shards=(dataclasses.replace(first, path=str(moved)), *inputs.shards[1:]))
    _, _, meta = aggregate(plan.cfg, listed, progress=False)
    assert str(moved) in meta["shard_fingerprints"] and first.path not in meta["shard_fingerprints"]
    # the item files are the listed ones: a list without a benchmark's item file is refused
    no_items = dataclasses.replace(inputs, items={b: p for b, p in inputs.items.items() if b != first.benchmark})
    with pytest.raises(ShardError, match=f"name no item file for {first.benchmark}"):
        aggregate(plan.cfg, no_items, progress=False)
