"""Benchmark outputs: a JSON record per script run (``benchmarks/results/<name>.json``) with
the exact command line, the machine, the code version and every measured number."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

from ..sysutil import atomic_write_text
from ..paths import PROJECT_ROOT
from ..provenance import code_version
from .machine import describe, machine_info
from .timing import format_table

RESULTS_DIR = PROJECT_ROOT / "benchmarks" / "results"


def command_line() -> str:
    """The command that ran this script, relative to the project root where possible."""
    argv = list(sys.argv)
    try:
        argv[0] = str(Path(argv[0]).resolve().relative_to(PROJECT_ROOT))
    except ValueError:
        pass
    return " ".join(shlex.quote(a) for a in argv)


def save(name: str, payload: dict, out_dir: Path | None = None) -> Path:
    """Write ``payload`` plus command line and machine info as ``<out_dir>/<name>.json``."""
    out = Path(out_dir or RESULTS_DIR) / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {"benchmark": name, "command": command_line(), "machine": machine_info(),
              "code_version": code_version(), **payload}
    atomic_write_text(out, json.dumps(record, indent=2, sort_keys=True, default=str) + "\n")
    return out


def publish(name: str, headers: list[str], rows: list[list[object]], payload: dict, *,
            out_dir: Path | str | None = None, note: str = "") -> Path:
    """The common end of every benchmark script: print the result table and the machine
    line (plus ``note``), then save ``payload`` with the table (:func:`save`)."""
    table = format_table(headers, rows)
    record = {**payload, "table": table}
    print("\n" + table)
    print(f"\nmachine: {describe(machine_info())}{'; ' + note if note else ''}")
    path = save(name, record, out_dir)
    print(f"written: {path}")
    return path
