"""Shared helpers for the tests/items/ files (real data in ../shared)."""

from __future__ import annotations

import os
from pathlib import Path

import typer
import yaml

from safetyrepro.config import DATA_ENV, load_config
from safetyrepro.paths import PROJECT_ROOT, resolve

DATA_DIR = resolve(os.environ.get(DATA_ENV) or "../shared/data/benchmarks", PROJECT_ROOT)
ENVELOPE = PROJECT_ROOT / "config" / "envelope.yaml"


def write_config(tmp_path: Path, benchmarks: dict, data: dict | None = None,
                 name: str = "items-test.yaml") -> Path:
    cfg = {"run_name": "items-test", "envelope": {"rules": str(ENVELOPE)},
           "benchmarks": benchmarks,
           "models": {"m": {"display_name": "m", "source": {"kind": "local", "path": "/none"}}},
           "runtime": {"results_dir": str(tmp_path / "results")}}
    # the shared benchmark data unless ``data`` says otherwise (the default data.local_dir is
    # relative to the config's folder, a temp folder here)
    cfg["data"] = {"local_dir": str(DATA_DIR), **(data or {})}
    path = tmp_path / name
    path.write_text(yaml.safe_dump(cfg))
    return path


def config(tmp_path: Path, benchmarks: dict, data: dict | None = None, name: str = "c.yaml"):
    return load_config(write_config(tmp_path, benchmarks, data, name))


def cli_app() -> typer.Typer:
    from safetyrepro.items.cli import register

    app = typer.Typer()

    @app.callback()
    def main() -> None:  # keep `items` a subcommand, as in the project CLI
        pass

    register(app)
    return app
