"""`safetyrepro import lm-eval|inspect|helm`: other harnesses' per-item results -> certify's table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

from ..config import load_config
from ..textsafe import terminal_safe as safe   # names and settings come from the imported files


def _write(res, out: Path, as_json: bool = False) -> None:
    """Write the long table atomically (CSV spreadsheet-safe: text cells from third-party logs
    that start with = + - @ tab or CR get a leading apostrophe; Parquet keeps them verbatim)
    and print what was imported (``--json``: the summary as one JSON object)."""
    from ..io import write_csv, write_parquet  # deferred: pyarrow; the CLI starts without it
    from .importers import summary  # deferred: pandas; the CLI starts without it

    info = summary(res, out)   # both writers create the folder (WriteError if they cannot)
    if out.suffix.lower() in {".parquet", ".pq"}:
        write_parquet(res.table, out, {"import": {k: info[k] for k in ("runs", "axes", "constant", "metrics")}})
    else:
        write_csv(res.table, out)
    if as_json:
        typer.echo(json.dumps(info, indent=1, sort_keys=True, default=str))
        return
    n = res.table.groupby(["benchmark", "model", "config"]).ngroups
    typer.echo(safe(f"wrote {out}: {len(res.table)} item scores, {n} (benchmark, model, config) cells, "
               f"{info['n_items']} items, {info['n_runs']} run file(s), tasks {', '.join(info['tasks'])}"))
    if info["filters"]:
        how = ("axis column 'filter' (one run per filter; pick one with --filter NAME)"
               if "filter" in res.axes else "one filter")
        typer.echo(safe(f"filters: {', '.join(info['filters'])}: {how}"))
    typer.echo(safe("axis columns (settings that differ): " + (", ".join(res.axes) or "none")))
    for k, v in res.constant.items():
        typer.echo(safe(f"  same in every run: {k} = {v}"))
    if res.axes:
        typer.echo(safe(f"next: safetyrepro certify {out} --config-cols {','.join(res.axes)}"))


_JSON = typer.Option(False, "--json", help="print a JSON summary (runs, tasks, filters, models, items, rows, output)")
_OUT = typer.Option(..., "--out", help="long table (.csv or .parquet)")


def register(app: typer.Typer) -> None:
    imp = typer.Typer(no_args_is_help=True, help="Read other harnesses' per-item results into the long "
                                                 "table certify reads (model, benchmark, config, item, score).")

    @imp.command("lm-eval")
    def lm_eval_cmd(
        paths: List[Path] = typer.Argument(..., help="lm-eval --output_path folders (written with --log_samples) "
                                                     "or results_*.json files"),
        out: Path = _OUT,
        metric: Optional[str] = typer.Option(None, "--metric", help="per-sample metric (default acc)"),
        benchmark: Optional[str] = typer.Option(None, "--benchmark",
                                                help="benchmark name for every task (default: from the task name)"),
        filter_name: Optional[str] = typer.Option(None, "--filter",
                                                  help="keep only this lm-eval filter pipeline (default: every "
                                                       "filter, as the axis column 'filter')"),
        as_json: bool = _JSON,
    ):
        """lm-evaluation-harness results + per-sample JSONL -> item-level long table."""
        from .importers import import_lmeval  # deferred: pandas; the CLI starts without it

        _write(import_lmeval(paths, metric, benchmark, filter_name), out, as_json)

    @imp.command("inspect")
    def inspect_cmd(
        logs: List[Path] = typer.Argument(..., help="Inspect eval logs (.eval/.json) or folders of them"),
        out: Path = _OUT,
        metric: Optional[str] = typer.Option(None, "--metric", help="scorer name (default: the only one)"),
        benchmark: Optional[str] = typer.Option(None, "--benchmark",
                                                help="benchmark name (default: from the task name)"),
        as_json: bool = _JSON,
    ):
        """Inspect eval logs or eval-set folders (read through inspect_ai.log) -> item-level long table."""
        from .importers import import_inspect  # deferred: pandas; the CLI starts without it

        _write(import_inspect(logs, metric, benchmark), out, as_json)

    @imp.command("helm")
    def helm_cmd(
        runs: List[Path] = typer.Argument(..., help="HELM run folders (benchmark_output/runs/<suite>/<run>) or "
                                                    "folders above them"),
        out: Path = _OUT,
        metric: Optional[str] = typer.Option(None, "--metric", help="per-instance stat (default exact_match)"),
        benchmark: Optional[str] = typer.Option(None, "--benchmark",
                                                help="benchmark name (default: from the run name)"),
        as_json: bool = _JSON,
    ):
        """HELM run folders (run_spec.json, scenario_state.json, per_instance_stats.json) -> long table."""
        from .importers import import_helm  # deferred: pandas; the CLI starts without it

        _write(import_helm(runs, metric, benchmark), out, as_json)

    app.add_typer(imp, name="import")


def register_stage(app: typer.Typer) -> None:
    @app.command("cross-package")
    def cross_package_cmd(
        config: Path = typer.Option(..., "--config"),
        items_dir: Path = typer.Option(..., "--items-dir", help="the run's items/ folder"),
        item_results: Path = typer.Option(..., "--item-results", help="the run's item_results.parquet"),
        out: Path = typer.Option(..., "--out", help="cross_package.parquet (a .csv is written beside it)"),
        work: Path = typer.Option(..., "--work", help="scratch folder (task files, logs of the packages)"),
        model: Optional[List[str]] = typer.Option(None, "--model", help="models (default: the config's)"),
        package: Optional[List[str]] = typer.Option(None, "--package", help="lm-eval, inspect (default: both)"),
        figure: Optional[Path] = typer.Option(None, "--figure", help="also draw the scores per package (.png)"),
        item_results_bf16: Optional[Path] = typer.Option(
            None, "--item-results-bf16", help="the precision check's item_results_bf16.parquet: the SafetyRepro "
                                              "rows take their cells from it where it has them"),
        lmeval_loop: str = typer.Option("shared-context", "--lmeval-loop",
                                        help="shared-context (each context computed once) or stock "
                                             "(lm-eval's own loop); docs/CROSS_PACKAGE.md"),
    ):
        """The nominal configuration in SafetyRepro, lm-eval and Inspect on the run's items and models:
        score, per-item agreement, spread across packages (pp) and ordering change per benchmark."""
        from .stage import run_stage  # deferred: pandas; the CLI starts without it

        cfg = load_config(config)
        df = run_stage(cfg, items_dir, item_results, out, work, models=model or None,
                       packages=tuple(package or ("lm-eval", "inspect")), figure=figure,
                       item_results_bf16=item_results_bf16, lmeval_loop=lmeval_loop)
        cols = ["benchmark", "model", "package", "precision", "compute", "score", "n_items", "agreement", "spread_pp", "ordering_changes"]
        typer.echo(df[cols].to_string(index=False))
