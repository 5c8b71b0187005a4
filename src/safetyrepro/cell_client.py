"""The thin client side of a cell job: hand the cell to the persistent worker of its model.

Every Snakemake cell job runs ``python -m safetyrepro.cell_client ...`` with the worker key
already resolved by the workflow plan (the idle timeout comes from the environment variable
SAFETYREPRO_WORKER_IDLE_S, set by the workflow's shell prefix), so the client imports neither
torch, pandas nor the config validator: its start-up is a few tens of milliseconds.
(`safetyrepro run-cell --worker` resolves the same values from the config and calls
:func:`send_cell`.)"""

from __future__ import annotations

import argparse
import json
import os
import sys

IDLE_ENV = "SAFETYREPRO_WORKER_IDLE_S"


def send_cell(*, state_dir: str, key: str, idle_timeout: float, config: str, model: str, benchmark: str,
              cell: str, seed: int, out: str, quantization: str) -> dict:
    from .worker.client import run_in_worker

    return run_in_worker(
        state_dir, key,
        "safetyrepro.cells:load_for_worker",
        {"config": config, "model": model, "quantization": quantization},
        "safetyrepro.cells:run_cell_in_worker",
        {"config": config, "model": model, "benchmark": benchmark, "cell": cell, "seed": seed,
         "out": out, "quantization": quantization},
        idle_timeout=idle_timeout,
        label=f"{model}/{benchmark}/{cell}/s{seed} ({quantization})",
    )


def run_cell_via_worker(*, config: str, model: str, benchmark: str, cell: str, seed: int, out: str,
                        quantization: str | None = None) -> dict:
    """Resolve the worker from the config (validated), then :func:`send_cell`."""
    from .config import load_config
    from .plan import Plan

    plan = Plan(load_config(config))
    quant = quantization or plan.quantization(model)
    return send_cell(state_dir=str(plan.worker_state_dir), key=plan.worker_key(model, quant),
                     idle_timeout=plan.worker_idle_timeout, config=config, model=model,
                     benchmark=benchmark, cell=cell, seed=seed, out=out, quantization=quant)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m safetyrepro.cell_client",
                                 description="Run one cell in its model's persistent worker.")
    for name in ("results-dir", "key", "config", "model", "benchmark", "cell", "out", "quantization"):
        ap.add_argument(f"--{name}", required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--idle-timeout", type=float, default=float(os.environ.get(IDLE_ENV, "120")),
                    help=f"worker idle timeout in seconds (default: ${IDLE_ENV} or 120)")
    a = ap.parse_args(argv)
    from .errors import SafetyReproError
    from .worker.state import default_state_dir

    state_dir = str(default_state_dir(os.path.abspath(a.results_dir)))
    try:
        summary = send_cell(state_dir=state_dir, key=a.key, idle_timeout=a.idle_timeout,
                            config=os.path.abspath(a.config),
                            model=a.model, benchmark=a.benchmark, cell=a.cell, seed=a.seed,
                            out=os.path.abspath(a.out), quantization=a.quantization)
    except SafetyReproError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
