"""The shards module: the metadata record round-trips through a real Parquet file, and every
broken shard is refused naming the file and what is wrong."""

from __future__ import annotations

import pytest

from safetyrepro.errors import ShardError
from safetyrepro.io import read_parquet, write_parquet
from safetyrepro.shards import KIND, SHARD_SCHEMA, ShardMeta, layout_hash, read_shard, write_shard
from shard_synth import synthetic_run, write_cell


@pytest.fixture(scope="module")
def shard(tmp_path_factory):
    plan = synthetic_run(tmp_path_factory.mktemp("shards"))
    return plan, write_cell(plan, "m-nf4", "truthfulqa", "T1-t0.7-k3-freeform", 1, n_correct=2)


def test_metadata_round_trips_typed(shard):
    plan, path = shard
    table, meta = read_shard(path)
    assert isinstance(meta, ShardMeta) and table.schema.equals(SHARD_SCHEMA, check_metadata=False)
    assert (meta.cell, meta.seed, meta.variant, meta.decoding) == ("T1-t0.7-k3-freeform", 1, "main", "t0.7")
    assert meta.decode_group == [list(g) for g in plan.decode_group("truthfulqa", "T1-t0.7-k3-freeform")]
    assert meta.as_dict()["kind"] == KIND and ShardMeta.from_dict(path, meta.as_dict()) == meta
    assert sum(table.column("correct").to_pylist()) == 2


@pytest.mark.parametrize("damage, message", [
    (lambda t, m: (t, {**m, "kind": "items"}), "not a cell shard (metadata kind='items')"),
    (lambda t, m: (t, {k: v for k, v in m.items() if k not in ("parser_version", "decode_group")}),
     "metadata lacks field(s) decode_group, parser_version"),
    (lambda t, m: (t.drop(["raw_output"]), m), "missing columns ['raw_output']"),
    (lambda t, m: (t.slice(0, 1), m), "1 rows but metadata says 4"),
])
def test_broken_shards_are_named(shard, tmp_path, damage, message):
    _, path = shard
    table, meta = read_parquet(path)
    bad = tmp_path / "bad.parquet"
    bad_table, bad_meta = damage(table, meta)
    write_parquet(bad_table, bad, bad_meta)
    with pytest.raises(ShardError) as err:
        read_shard(bad)
    assert str(err.value).startswith(f"{bad}: ") and message in str(err.value)


def test_the_writer_refuses_a_row_count_its_metadata_does_not_say(shard, tmp_path):
    _, path = shard
    table, meta = read_shard(path)
    with pytest.raises(ShardError, match="3 rows but metadata says n_items=4"):
        write_shard(tmp_path / "x.parquet", table.to_pylist()[:3], meta)
    assert not (tmp_path / "x.parquet").exists()


def test_layout_hash_follows_schema_and_fields():
    assert layout_hash() == layout_hash() and len(layout_hash()) == 64
