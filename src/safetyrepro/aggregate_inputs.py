"""What an aggregation job reads: each cell's shard with the fingerprint the plan expects of
it, and the item files. The workflow writes the list for the job (:func:`write_inputs`) so the
job opens exactly what its rule declares; a module of its own so the plan can build it without
importing the aggregation code."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from .errors import ShardError
from .sysutil import atomic_write_text


@dataclass(frozen=True)
class ShardEntry:
    """One cell aggregation reads: its shard and the fingerprint the plan expects of it."""
    path: str
    model: str
    benchmark: str
    config_id: str
    seed: int
    fingerprint: str


@dataclass(frozen=True)
class AggregateInputs:
    """What the aggregation of ``variant`` reads: every cell's shard (in the plan's job
    order) and each benchmark's item file (benchmark -> path, in the config's order)."""
    variant: str
    shards: tuple[ShardEntry, ...]
    items: dict[str, str]


def write_inputs(path: str | Path, inputs: AggregateInputs) -> None:
    """Write ``inputs`` as JSON, atomically (the workflow's list for the aggregation job)."""
    atomic_write_text(path, json.dumps({"variant": inputs.variant, "items": inputs.items,
                                        "shards": [asdict(e) for e in inputs.shards]}, indent=0))


def read_inputs(path: str | Path) -> AggregateInputs:
    """The :class:`AggregateInputs` :func:`write_inputs` wrote; ShardError for a malformed file."""
    try:
        data = json.loads(Path(path).read_text())
        shards = tuple(ShardEntry(**{**e, "seed": int(e["seed"])}) for e in data["shards"])
        return AggregateInputs(str(data["variant"]), shards, {str(b): str(p) for b, p in data["items"].items()})
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ShardError(f"{path}: not an aggregation input list ({exc})") from exc
