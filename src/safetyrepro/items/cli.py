"""``safetyrepro items``: build the fixed item subsets and few-shot pools."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..config import load_config

DEFAULT_CONFIG = "config/config.yaml"


def run_items(config: Path, benchmark: str | None = None, out_dir: Path | None = None,
              echo=typer.echo) -> list[dict]:
    """Build one benchmark (or every configured one) and print counts per stratum + hashes."""
    from tqdm import tqdm  # deferred: tqdm; the CLI starts without it

    from .build import build_items  # deferred: pandas; the CLI starts without it
    from .schema import check_benchmark  # deferred: pandas; the CLI starts without it

    cfg = load_config(config)
    names = [check_benchmark(benchmark)] if benchmark else cfg.benchmarks
    summaries = []
    for name in tqdm(names, desc="items", unit="benchmark", disable=len(names) < 2):
        s = build_items(cfg, name, out_dir)
        summaries.append(s)
        echo(f"{name}: {s['n_items']} items, subset_hash {s['subset_hash']}")
        for stratum, count in s["strata"].items():
            echo(f"  {stratum:<40} {count:>5}")
        echo(f"  few-shot pool: {', '.join(s['fewshot_ids'])}")
        for src in s["sources"]:
            echo(f"  source {src['path']} sha256 {src['sha256']}")
        if s.get("unchanged"):
            echo(f"  items unchanged (content {s['content_hash'][:12]}): left {s['items_path']} "
                 f"and {s['fewshot_path']} as they were")
        else:
            echo(f"  wrote {s['items_path']}")
            echo(f"  wrote {s['fewshot_path']}")
    return summaries


def register(app: typer.Typer) -> None:
    """Add the ``items`` command to the project CLI."""

    @app.command("items")
    def items(
        config: Path = typer.Option(Path(DEFAULT_CONFIG), "--config", "-c",
                                    help="run config (YAML)"),
        benchmark: Optional[str] = typer.Option(
            None, "--benchmark", "-b", help="build only this benchmark (default: all configured)"),
        out_dir: Optional[Path] = typer.Option(
            None, "--out-dir", help="output folder (default: <results_dir>/items)"),
    ) -> None:
        """Write results/items/<benchmark>.parquet and <benchmark>.fewshot.parquet."""
        run_items(config, benchmark, out_dir)
