"""The thin client side of a cell job: hand the cell to the persistent worker of its model.

Imported by every Snakemake cell job, so it must stay light (no torch, no pandas)."""

from __future__ import annotations

from .config import load_config
from .hashing import canonical_hash


def worker_key(cfg, model: str, quantization: str) -> str:
    """One worker per (model, quantization, model source): a changed source loads afresh."""
    from .worker.state import make_key

    return make_key(model, quantization, canonical_hash(cfg.model(model)["source"])[:12])


def run_cell_via_worker(*, config: str, model: str, benchmark: str, cell: str, seed: int, out: str,
                        quantization: str | None = None) -> dict:
    from .worker.client import run_in_worker
    from .worker.state import default_state_dir

    cfg = load_config(config)
    quant = quantization or cfg.model(model).get("quantization", "nf4")
    return run_in_worker(
        default_state_dir(cfg.results_dir), worker_key(cfg, model, quant),
        "safetyrepro.cells:load_for_worker",
        {"config": config, "model": model, "quantization": quant},
        "safetyrepro.cells:run_cell_in_worker",
        {"config": config, "model": model, "benchmark": benchmark, "cell": cell, "seed": seed,
         "out": out, "quantization": quant},
        idle_timeout=cfg.section("runtime").get("worker_idle_timeout_s", 120),
        label=f"{model}/{benchmark}/{cell}/s{seed} ({quant})",
    )
