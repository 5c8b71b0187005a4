"""The thin client side of a cell job: hand the cell to the persistent worker of its model.

Every Snakemake cell job runs ``python -m safetyrepro.cell_client ...``; the cell rule passes
the cell (its wildcards, the quantization, decode group and fingerprint the plan resolved; a
decode group's job passes each of its cells and sends them one after another),
the files the cell reads as its declared inputs (run config, rules, item subset, few-shot pool,
prepared-model marker), its output, and the worker settings (key, state root, timeouts). The
client builds one :class:`.cell_request.CellRequest` from them and sends it to the worker, which
opens exactly those files. So the client imports neither torch, pandas nor the config
validator, and its start-up is a few tens of milliseconds. (`safetyrepro run-cell --worker`
resolves the request with the plan, :meth:`.plan.Plan.cell_request`, and calls
:func:`send_cell`.)"""

from __future__ import annotations

import json
import os
import sys

from .cell_request import CellRequest, parse_decode_group
from .errors import SafetyReproError
from .worker.client import run_in_worker
from .worker.layout import node_state_dir


def send_cell(request: CellRequest, *, state_dir: str, key: str, idle_timeout: float,
              timeout: float | None = None, device_wait: float | None = None) -> dict:
    """Run ``request`` in this node's worker for ``key`` (started with the request's run
    config, model and quantization if none is running)."""
    return run_in_worker(
        state_dir, key,
        "safetyrepro.cells:load_runner",
        {"config_path": request.config_path, "model": request.model, "quantization": request.quantization},
        "safetyrepro.cells:run_cell_in_worker",
        {"request": request.as_message()},
        idle_timeout=idle_timeout, call_timeout=timeout, device_wait=device_wait,
        label=request.id,
    )


def run_cell_via_worker(*, config_path: str, model: str, benchmark: str, config_id: str, seed: int,
                        out: str, variant: str = "main") -> dict:
    """Resolve the cell and its worker with the plan of ``config_path`` (validated), then
    :func:`send_cell`."""
    from .config import load_config  # deferred: yaml and the validator; cell jobs skip them
    from .plan import Plan  # deferred: tasks, rules, fingerprints; cell jobs skip them

    plan = Plan(load_config(config_path))
    request = plan.cell_request(model, benchmark, config_id, seed, out, variant)
    return send_cell(request, state_dir=str(plan.layout.worker_state_dir),
                     key=plan.worker_key(model, request.quantization),
                     idle_timeout=plan.runtime.worker_idle_timeout, timeout=plan.runtime.cell_timeout,
                     device_wait=plan.runtime.device_wait)


# the request's fields, then the worker's settings
CELL = ("config", "config-id", "model", "variant", "quantization", "benchmark", "seed",
        "decode-group", "rules", "items", "fewshot", "model-marker", "fingerprint", "out")
WORKER = ("state-root", "key", "idle-timeout", "timeout", "device-wait")
REQUIRED = CELL + WORKER
# given once per cell: a group job (workflow/rules/cells.smk, Plan.group_jobs) names each of its
# cells, which share the rest
EACH = ("config-id", "seed", "fingerprint", "out")
USAGE = ("usage: python -m safetyrepro.cell_client " + " ".join(f"--{n} X" for n in REQUIRED)
         + "\n\nRun one cell, or the cells of one decode group (--config-id, --seed, --fingerprint and "
         "--out once per cell), in its model's persistent worker (the cell rules' command). "
         "--config: the run config YAML; --config-id: the envelope point "
         "(template-decoding-shots-scoring); --decode-group: the decodings it is decoded with, "
         "as DECODING:SEEDS,...; --rules, --items, --fewshot, --model-marker: the files the cell "
         "reads (the rule's declared inputs); --fingerprint: the cell fingerprint the workflow "
         "planned (the worker checks it against its loaded code and data); --state-root: the "
         "folder of the per-node worker state folders (this node's is <state-root>/<hostname>); "
         "--idle-timeout: worker idle timeout in seconds; --timeout: seconds the cell may run "
         "(runtime.cell_timeout_s); --device-wait: seconds a new worker may wait for the device "
         "(runtime.device_wait_s).")


def requests_from_args(opts: dict) -> list[CellRequest]:
    """The :class:`CellRequest` of each cell of the parsed arguments (paths made absolute), in
    the order given; ValueError for a malformed seed or decode group."""
    path = os.path.abspath
    group = parse_decode_group(opts["decode-group"])
    return [CellRequest(
        model=opts["model"], variant=opts["variant"], quantization=opts["quantization"],
        benchmark=opts["benchmark"], config_id=config_id, seed=int(seed), decode_group=group,
        config_path=path(opts["config"]), rules=path(opts["rules"]), items=path(opts["items"]),
        fewshot=path(opts["fewshot"]), model_marker=path(opts["model-marker"]), out=path(out),
        fingerprint=fingerprint)
        for config_id, seed, fingerprint, out in zip(opts["config-id"], opts["seed"], opts["fingerprint"],
                                                     opts["out"])]


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


def parse_args(argv: list[str]) -> dict:
    """``--name value`` pairs (``--name=value`` too) into a dict; the per-cell options
    (:data:`EACH`) into lists, one value per cell (a group job names each of its cells). A
    hand-written parser, not argparse: argparse (with ``re`` and ``gettext``) is the largest
    import of a process that runs once per cell job."""
    names = set(REQUIRED)
    out: dict = {}
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
        if name in EACH:
            out.setdefault(name, []).append(value)
        elif name in out:
            raise UsageError(f"--{name} given twice")
        else:
            out[name] = value
        i += 1
    missing = [f"--{n}" for n in REQUIRED if n not in out]
    if missing:
        raise UsageError("missing " + ", ".join(missing))
    if len({len(out[n]) for n in EACH}) > 1:
        raise UsageError(", ".join(f"--{n}" for n in EACH) + " are given once per cell, as often each"
                         " (here " + ", ".join(f"{len(out[n])} --{n}" for n in EACH) + ")")
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(a in ("-h", "--help") for a in argv):
        print(USAGE)
        return 0
    try:
        opts = parse_args(argv)
        requests = requests_from_args(opts)
        idle = float(opts["idle-timeout"])
        timeout, device_wait = float(opts["timeout"]), float(opts["device-wait"])
    except (UsageError, ValueError) as exc:
        print(f"{USAGE}\n\nerror: {exc}", file=sys.stderr)
        return 2

    state_dir = str(node_state_dir(os.path.abspath(opts["state-root"])))
    for request in requests:  # a group job's cells one after another (the first computes all)
        where = f" (cell {request.id})" if len(requests) > 1 else ""
        try:
            summary = send_cell(request, state_dir=state_dir, key=opts["key"], idle_timeout=idle,
                                timeout=timeout, device_wait=device_wait)
        except SafetyReproError as exc:
            print(f"error{where}: {exc}", file=sys.stderr)
            return 2
        problem = check_shard_file(request.out)
        if problem is not None:
            print(f"error: the worker reported shard {request.out} written, but {problem}", file=sys.stderr)
            return 2
        print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
