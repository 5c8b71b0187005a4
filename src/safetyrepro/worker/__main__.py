"""``python -m safetyrepro.worker serve ...``: how clients launch a worker process.

Kept on argparse (not the typer CLI) so that a worker starts with as few imports as
possible; ``safetyrepro worker serve`` (see :mod:`.cli`) runs the same :func:`serve`."""

from __future__ import annotations

import argparse
import json
import os
import sys

from ..errors import SafetyReproError
from .server import serve


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m safetyrepro.worker")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("serve", help="run a worker for one resource key")
    p.add_argument("--state-dir", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--loader", required=True, help="module:function returning the state")
    p.add_argument("--loader-arg", default="{}", help="JSON object of keyword arguments")
    p.add_argument("--idle-timeout", type=float, default=120.0)
    p.add_argument("--slots", type=int, default=1, help="workers allowed to hold the device")
    p.add_argument("--owner", default=None,
                   help="PID:START of the process whose exit ends this worker (cluster jobs)")
    p.add_argument("--device-wait", type=float, default=None,
                   help="fail (naming the holder) after waiting this long for the device")
    p.add_argument("--detach", action="store_true",
                   help="fork; return once the worker listens")
    args = parser.parse_args(argv)
    try:
        loader_args = json.loads(args.loader_arg)
    except ValueError as exc:
        parser.error(f"--loader-arg is not JSON: {exc}")
    try:
        return serve(args.state_dir, args.key, args.loader, loader_args,
                     idle_timeout=args.idle_timeout, slots=args.slots, detach=args.detach,
                     owner=args.owner, device_wait=args.device_wait)
    except (ValueError, SafetyReproError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown (slow with a model loaded); the device lock goes with the process.
    os._exit(code)
