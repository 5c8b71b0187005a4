"""CLI hook: ``safetyrepro prepare-model`` and ``safetyrepro bench-model``.

The main CLI calls :func:`register` to add the commands."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from ..config import load_config
from ..sysutil import atomic_write_text
from ..weights import recorded_weights_hash
from .chat import template_hash


def register(app: typer.Typer) -> None:
    @app.command("prepare-model")
    def prepare_model_cmd(
        config: Path = typer.Option(..., "--config", help="run config (YAML)"),
        model: list[str] = typer.Option(None, "--model", help="model key (repeatable; default: all)"),
        quiet: bool = typer.Option(False, "--quiet", help="no progress output"),
        marker: Path = typer.Option(None, "--marker",
                                    help="also write a JSON record (path, weights hash, source) here"),
    ) -> None:
        """Download, verify and convert model(s) once; print the loadable path of each.

        Hub models are downloaded here (progress bars on stderr), never inside a cell; a
        failure names the model and what to do, and exits with status 2."""
        from ..plan import Plan  # deferred: ~30 ms of CLI start-up (tasks, fingerprints)
        from .load import require_device  # deferred: ~8 ms of CLI start-up (model loading code)
        from .prepare import prepare_model  # deferred: ~5 ms of CLI start-up (model sources)

        cfg = load_config(config)
        plan = Plan(cfg)
        require_device(cfg)  # runtime.device: cuda without a GPU: stop before downloading
        records = {}
        for key in model or cfg.models:
            if cfg.model(key)["source"]["kind"] == "fake":   # nothing to prepare: no weights
                typer.echo(f"{key}\tfake (no model)")
                records[key] = {"path": None, "weights_hash": None, "chat_template_hash": None,
                                "source_fingerprint": plan.fingerprints.source_fingerprint(key)}
                continue
            path = prepare_model(cfg, key, progress=not quiet)
            typer.echo(f"{key}\t{path}")
            records[key] = {"path": str(path),
                            "weights_hash": recorded_weights_hash(cfg.resources_dir, path),
                            "chat_template_hash": _template_hash(path),
                            "source_fingerprint": plan.fingerprints.source_fingerprint(key)}
        if marker is not None:
            atomic_write_text(marker, json.dumps(records, indent=2, sort_keys=True))

    def _template_hash(path) -> str:
        from transformers import AutoTokenizer  # deferred: transformers; the CLI starts without it

        return template_hash(AutoTokenizer.from_pretrained(str(path)))

    @app.command("bench-model")
    def bench_model_cmd(
        config: Path = typer.Option(..., "--config", help="run config (YAML)"),
        model: str = typer.Option(..., "--model", help="model key"),
        quantization: str = typer.Option(None, "--quantization", help="nf4 | bf16 | fp32"),
        batch_size: int = typer.Option(16, "--batch-size"),
        prompt_tokens: int = typer.Option(256, "--prompt-tokens"),
        new_tokens: int = typer.Option(32, "--new-tokens"),
    ) -> None:
        """Measure prefill / decode / scoring throughput of one model (JSON on stdout)."""
        from ..inference.bench import measure_speed  # deferred: torch; the CLI starts without it
        from .load import load_model  # deferred: ~8 ms of CLI start-up (model loading code)

        lm = load_model(load_config(config), model, quantization=quantization)
        typer.echo(json.dumps(measure_speed(lm, batch_size=batch_size,
                                            prompt_tokens=prompt_tokens, new_tokens=new_tokens)))
