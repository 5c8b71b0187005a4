"""Where a run's files live under its results folder: items, few-shot pools, prepared-model
markers, shards per variant, aggregation outputs and the model workers' state. Paths only:
nothing here reads the disk or knows the envelope (the plan enumerates the jobs)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .worker.layout import node_state_dir, state_root

# variant -> the folder of its shards under the results folder. "bf16" is the precision
# check: its configs in bf16 for every model (safetyrepro.plan.Plan.jobs).
SHARD_ROOTS = {"main": "shards", "bf16": "shards_bf16"}
SHARD_PATTERN = "{shards}/{model}/{benchmark}/{config_id}/s{seed}.parquet"  # under the results folder


def variant_of_shard_root(root: str) -> str:
    """The variant whose shards live in ``root`` (a folder name of :data:`SHARD_ROOTS`)."""
    for variant, r in SHARD_ROOTS.items():
        if r == root:
            return variant
    raise ValueError(f"{root!r} is no shard folder (expected one of {sorted(SHARD_ROOTS.values())})")


def aggregate_outputs(out_dir: str | Path, variant: str) -> dict[str, Path]:
    """What aggregation writes into ``out_dir`` for ``variant`` (its rules declare the same)."""
    out_dir = Path(out_dir)
    if variant != "main":
        return {"cell_scores": out_dir / f"cell_scores_{variant}.parquet",
                "item_results": out_dir / f"item_results_{variant}.parquet"}
    return {"cell_scores": out_dir / "cell_scores.parquet", "cell_scores_csv": out_dir / "cell_scores.csv",
            "item_results": out_dir / "item_results.parquet", "provenance": out_dir / "provenance.json"}


@dataclass(frozen=True)
class ResultsLayout:
    """The paths of one results folder."""

    results: Path

    def items_path(self, benchmark: str) -> Path:
        return self.results / "items" / f"{benchmark}.parquet"

    def fewshot_path(self, benchmark: str) -> Path:
        return self.results / "items" / f"{benchmark}.fewshot.parquet"

    def model_marker(self, model: str) -> Path:
        return self.results / "models" / f"{model}.json"

    def shard_path(self, model: str, benchmark: str, config_id: str, seed: int | str, variant: str = "main") -> Path:
        return self.results / SHARD_PATTERN.format(shards=SHARD_ROOTS[variant], model=model,
                                                   benchmark=benchmark, config_id=config_id, seed=seed)

    @property
    def worker_state_root(self) -> Path:
        """The folder holding each node's worker state folder (``<root>/<hostname>``)."""
        return state_root(self.results)

    @property
    def worker_state_dir(self) -> Path:
        """This node's worker state folder."""
        return node_state_dir(self.worker_state_root)
