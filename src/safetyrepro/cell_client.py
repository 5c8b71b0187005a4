"""The thin client side of a cell job: hand the cell to the persistent worker of its model.

Every Snakemake cell job runs ``python -m safetyrepro.cell_client ...`` with the worker key
already resolved by the workflow plan (the idle timeout comes from the environment variable
SAFETYREPRO_WORKER_IDLE_S, set by the workflow's shell prefix), so the client imports neither
torch, pandas nor the config validator: its start-up is a few tens of milliseconds.
(`safetyrepro run-cell --worker` resolves the same values from the config and calls
:func:`send_cell`.)"""

from __future__ import annotations

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


REQUIRED = ("results-dir", "key", "config", "model", "benchmark", "cell", "out", "quantization",
            "seed")
USAGE = ("usage: python -m safetyrepro.cell_client " + " ".join(f"--{n} X" for n in REQUIRED)
         + " [--idle-timeout S]\n\nRun one cell in its model's persistent worker (the cell "
         f"rule's command). --idle-timeout: worker idle timeout in seconds (default: ${IDLE_ENV} "
         "or 120).")


class UsageError(Exception):
    pass


def parse_args(argv: list[str]) -> dict[str, str]:
    """``--name value`` pairs (``--name=value`` too) into a dict. A hand-written parser, not
    argparse: argparse (with ``re`` and ``gettext``) is the largest import of a process that
    runs once per cell job."""
    names = set(REQUIRED) | {"idle-timeout"}
    out: dict[str, str] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--"):
            raise UsageError(f"unexpected argument {arg!r}")
        name, eq, value = arg[2:].partition("=")
        if name not in names:
            raise UsageError(f"unknown option --{name}")
        if not eq:
            if i + 1 >= len(argv):
                raise UsageError(f"--{name} needs a value")
            i += 1
            value = argv[i]
        if name in out:
            raise UsageError(f"--{name} given twice")
        out[name] = value
        i += 1
    missing = [f"--{n}" for n in REQUIRED if n not in out]
    if missing:
        raise UsageError("missing " + ", ".join(missing))
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(a in ("-h", "--help") for a in argv):
        print(USAGE)
        return 0
    try:
        opts = parse_args(argv)
        seed = int(opts["seed"])
        idle = float(opts.get("idle-timeout", os.environ.get(IDLE_ENV, "120")))
    except (UsageError, ValueError) as exc:
        print(f"{USAGE}\n\nerror: {exc}", file=sys.stderr)
        return 2

    from .errors import SafetyReproError
    from .worker.state import default_state_dir

    state_dir = str(default_state_dir(os.path.abspath(opts["results-dir"])))
    try:
        summary = send_cell(state_dir=state_dir, key=opts["key"], idle_timeout=idle,
                            config=os.path.abspath(opts["config"]), model=opts["model"],
                            benchmark=opts["benchmark"], cell=opts["cell"], seed=seed,
                            out=os.path.abspath(opts["out"]), quantization=opts["quantization"])
    except SafetyReproError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
