"""A cell's shard: one Parquet file, a row per item, with a typed metadata record.

The row schema (:data:`SHARD_SCHEMA`) holds the prompt, the raw output (free-form) or the
candidate log-likelihoods (logprob), the write-time parse and token counts; the metadata
(:class:`ShardMeta`) says which cell of which variant it is, what produced it (model,
quantization, code version, fingerprint, decode group) and which parser version made the
write-time parse (aggregation re-parses the raw outputs with the current parsers).
:func:`write_shard` writes both atomically; :func:`read_shard` checks them and names the file
and field on any problem."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from .errors import ShardError
from .hashing import canonical_hash
from .io import read_parquet, write_parquet

KIND = "shard"


def _schema():
    return pa.schema([
        ("item_id", pa.string()), ("prompt_hash", pa.string()), ("prompt", pa.string()),
        ("raw_output", pa.string()), ("parsed_label", pa.string()), ("parse_ok", pa.bool_()),
        ("correct", pa.bool_()), ("cand_logliks", pa.list_(pa.float64())),
        ("cand_ntokens", pa.list_(pa.int32())), ("chosen_index", pa.int32()),
        ("n_prompt_tokens", pa.int32()), ("n_gen_tokens", pa.int32()),
        ("finish_reason", pa.string()), ("latency_s", pa.float64()),
    ])


SHARD_SCHEMA = _schema()


@dataclass(frozen=True)
class ShardMeta:
    """What a shard is and what produced it."""
    # the cell
    cell: str                    # config id, e.g. T2-t0.3-k3-freeform
    model: str
    benchmark: str
    seed: int
    variant: str                 # main, or bf16 (the precision check)
    template: str
    decoding: str
    shots: str
    scoring: str
    temperature: float
    top_p: float
    max_new_tokens: int | None   # free-form only
    decode_group: list           # [[decoding, n_seeds], ...] generated together (plan.decode_group)
    # its inputs
    template_hash: str
    chat_template_hash: str | None  # the model's chat template (models.chat.template_hash)
    rules_stamp: str
    config_hash: str
    subset_hash: str | None
    items_content_hash: str | None  # content_hash of the item file it scored (aggregation checks it)
    fewshot_ids: list
    fewshot_hash: str | None
    # what produced it
    fingerprint: str             # plan.cell_fingerprint: a shard with another one is stale
    parser_version: str          # of the write-time parse in parsed_label / parse_ok / correct
    model_info: dict
    quantization: str
    device: str | None
    batching: dict               # the engine's batch plans and out-of-memory splits (BatchRecord.as_dict)
    code_version: dict
    n_items: int
    wall_s: float

    def as_dict(self) -> dict[str, Any]:
        return {"kind": KIND, **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, path: str | Path, meta: dict[str, Any]) -> "ShardMeta":
        if meta.get("kind") != KIND:
            raise ShardError(f"{path}: not a cell shard (metadata kind={meta.get('kind')!r})")
        names = [f.name for f in dataclasses.fields(cls)]
        missing = [n for n in names if n not in meta]
        if missing:
            raise ShardError(f"{path}: metadata lacks field(s) {', '.join(missing)} (written by "
                             "older code; rerun the cell)")
        return cls(**{n: meta[n] for n in names})


def layout_hash() -> str:
    """Hash of the shard layout (row schema and metadata fields): part of every cell
    fingerprint, so a layout change reruns the cells and a reader's edit does not."""
    return canonical_hash({"schema": SHARD_SCHEMA.to_string(), "meta": [f.name for f in dataclasses.fields(ShardMeta)]})


def write_shard(out: str | Path, rows: list[dict], meta: ShardMeta) -> None:
    """Write ``rows`` (dicts with :data:`SHARD_SCHEMA`'s columns) and ``meta`` atomically."""
    if len(rows) != meta.n_items:
        raise ShardError(f"{out}: {len(rows)} rows but metadata says n_items={meta.n_items}")
    write_parquet(pa.Table.from_pylist(rows, schema=SHARD_SCHEMA), out, meta.as_dict())


def read_shard(path: str | Path):
    """``(table, ShardMeta)`` of a shard, checked: kind, metadata fields, columns, row count."""
    table, raw = read_parquet(path)
    meta = ShardMeta.from_dict(path, raw)
    missing = set(SHARD_SCHEMA.names) - set(table.column_names)
    if missing:
        raise ShardError(f"{path}: missing columns {sorted(missing)}")
    if table.num_rows != meta.n_items:
        raise ShardError(f"{path}: {table.num_rows} rows but metadata says {meta.n_items}")
    return table, meta
