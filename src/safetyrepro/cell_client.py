"""The thin client side of a cell job: hand the cell to the persistent worker of its model.

Every Snakemake cell job runs ``python -m safetyrepro.cell_client ...``; the workflow passes
everything as arguments: what the cell reads (config, variant, item and few-shot files), the
worker key and quantization (resolved by the plan), the worker state root and idle timeout.
So the client imports neither torch, pandas nor the config validator, and its start-up is a
few tens of milliseconds. (`safetyrepro run-cell --worker` resolves the same values from the
config and calls :func:`send_cell`.)"""

from __future__ import annotations

import json
import os
import sys


def send_cell(*, state_dir: str, key: str, idle_timeout: float, config: str, model: str, benchmark: str,
              cell: str, seed: int, out: str, quantization: str, variant: str, items: str,
              fewshot: str, fingerprint: str | None = None, timeout: float | None = None,
              device_wait: float | None = None) -> dict:
    from .worker.client import run_in_worker

    return run_in_worker(
        state_dir, key,
        "safetyrepro.cells:load_for_worker",
        {"config": config, "model": model, "quantization": quantization},
        "safetyrepro.cells:run_cell_in_worker",
        {"config": config, "model": model, "benchmark": benchmark, "cell": cell, "seed": seed,
         "out": out, "quantization": quantization, "variant": variant, "items": items,
         "fewshot": fewshot, "fingerprint": fingerprint},
        idle_timeout=idle_timeout, call_timeout=timeout, device_wait=device_wait,
        label=f"{model}/{benchmark}/{cell}/s{seed} ({variant}, {quantization})",
    )


def run_cell_via_worker(*, config: str, model: str, benchmark: str, cell: str, seed: int, out: str,
                        variant: str = "main") -> dict:
    """Resolve the worker and the cell's inputs from the config (validated), then
    :func:`send_cell`."""
    from .config import load_config
    from .plan import Plan

    plan = Plan(load_config(config))
    quant = plan.quantization(model, variant)
    return send_cell(state_dir=str(plan.worker_state_dir), key=plan.worker_key(model, quant),
                     idle_timeout=plan.worker_idle_timeout, config=config, model=model,
                     benchmark=benchmark, cell=cell, seed=seed, out=out, quantization=quant,
                     variant=variant, items=str(plan.items_path(benchmark)),
                     fewshot=str(plan.fewshot_path(benchmark)),
                     fingerprint=plan.cell_fingerprint(model, benchmark, cell, seed, variant, chat_template=False),
                     timeout=plan.cell_timeout, device_wait=plan.device_wait)


REQUIRED = ("config", "model", "variant", "quantization", "benchmark", "cell", "seed", "items",
            "fewshot", "state-root", "key", "idle-timeout", "timeout", "device-wait", "fingerprint",
            "out")
USAGE = ("usage: python -m safetyrepro.cell_client " + " ".join(f"--{n} X" for n in REQUIRED)
         + "\n\nRun one cell in its model's persistent worker (the cell rule's command). "
         "--state-root: the folder of the per-node worker state folders (this node's is "
         "<state-root>/<hostname>); --idle-timeout: worker idle timeout in seconds; "
         "--timeout: seconds the cell may run (runtime.cell_timeout_s); --device-wait: seconds "
         "a new worker may wait for the device (runtime.device_wait_s); "
         "--fingerprint: the cell fingerprint the workflow planned (the worker checks it "
         "against its loaded code and data).")


def check_shard_file(path: str) -> str | None:
    """Why ``path`` is not a complete Parquet file (missing, empty, cut short), or None. The
    worker has read the shard back whole; this standard-library check is the job's own, in
    its process, before it reports success (Parquet starts and ends with ``PAR1``)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(4)
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(size - 4, 0))
            tail = fh.read(4)
    except OSError as exc:
        return f"cannot read it back ({exc})"
    if size < 12 or head != b"PAR1" or tail != b"PAR1":
        return f"it does not read back as a complete Parquet file ({size} bytes)"
    return None


class UsageError(Exception):
    pass


def parse_args(argv: list[str]) -> dict[str, str]:
    """``--name value`` pairs (``--name=value`` too) into a dict. A hand-written parser, not
    argparse: argparse (with ``re`` and ``gettext``) is the largest import of a process that
    runs once per cell job."""
    names = set(REQUIRED)
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
        idle = float(opts["idle-timeout"])
        timeout, device_wait = float(opts["timeout"]), float(opts["device-wait"])
    except (UsageError, ValueError) as exc:
        print(f"{USAGE}\n\nerror: {exc}", file=sys.stderr)
        return 2

    from .errors import SafetyReproError
    from .worker.layout import node_state_dir

    path = os.path.abspath
    try:
        summary = send_cell(state_dir=str(node_state_dir(path(opts["state-root"]))), key=opts["key"],
                            idle_timeout=idle, config=path(opts["config"]), model=opts["model"],
                            benchmark=opts["benchmark"], cell=opts["cell"], seed=seed,
                            out=path(opts["out"]), quantization=opts["quantization"],
                            variant=opts["variant"], items=path(opts["items"]),
                            fewshot=path(opts["fewshot"]), fingerprint=opts["fingerprint"],
                            timeout=timeout, device_wait=device_wait)
    except SafetyReproError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    problem = check_shard_file(path(opts["out"]))
    if problem is not None:
        print(f"error: the worker reported shard {path(opts['out'])} written, but {problem}",
              file=sys.stderr)
        return 2
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
