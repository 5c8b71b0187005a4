"""The `safetyrepro` command line. Each subcommand is a thin shell over package functions;
heavy imports (torch, pandas, ...) happen inside the commands so that start-up stays cheap
for the many short processes a workflow spawns."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Optional

import typer
from typer._click.exceptions import NoArgsIsHelpError

from . import grid as grid_mod
from .aggregate_inputs import read_inputs
from .analysis.cli import register as analysis_cmd
from .config import load_config
from .crosspkg.cli import register as import_cmd
from .crosspkg.cli import register_stage as cross_package_cmd
from .errors import ConfigError, SafetyReproError, ShardError, WriteError
from .items.cli import register as items_cmd
from .models.cli import register as models_cmd
from .provenance import code_version_string
from .sysutil import atomic_write_text
from .textsafe import frame_terminal_safe, terminal_safe
from .worker.cli import register as worker_cmd

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="SafetyRepro: how often does 'model A is safer than model B' flip across harness choices?")


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"safetyrepro {code_version_string()}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                                 help="print the version (package+commit.source hash) and exit"),
):
    """SafetyRepro: how often does 'model A is safer than model B' flip across harness choices?"""


@app.command()
def grid(
    config: Path = typer.Option(..., "--config", help="run config YAML"),
    envelope: Optional[str] = typer.Option(None, "--envelope", help="sub-envelope (default: the config's)"),
    as_json: bool = typer.Option(False, "--json", help="machine-readable output"),
    list_cells: bool = typer.Option(False, "--list", help="also list every config id"),
):
    """Enumerate the valid cells of a config's envelope and print the counts and rules stamp."""
    cfg = load_config(config)
    env = envelope or cfg.envelope_name
    cfg.rules.sub_envelope(env)  # validates the name
    summary = grid_mod.summarize_config(cfg, env)
    if list_cells:
        summary["configs"] = {b: [c.id for c in grid_mod.configs(cfg.rules, b, env)] for b in cfg.benchmarks}
    if as_json:
        typer.echo(json.dumps(summary, indent=2))
        return
    typer.echo(f"config      {cfg.path}  (hash {cfg.hash[:12]})")
    typer.echo(f"rules       {cfg.rules.path}  version {cfg.rules.version}")
    typer.echo(f"rules stamp {cfg.rules.stamp}")
    typer.echo(f"envelope    {env}")
    typer.echo(f"models      {len(cfg.models)}: {', '.join(cfg.models)}")
    typer.echo(f"{'benchmark':<12} {'configs':>7} {'freeform':>8} {'logprob':>7} {'jobs/model':>10}")
    for b, v in summary["benchmarks"].items():
        typer.echo(f"{b:<12} {v['configs']:>7} {v['freeform']:>8} {v['logprob']:>7} {v['jobs_per_model']:>10}")
    typer.echo(f"valid (model, benchmark, config) cells: {summary['cells']}")
    typer.echo(f"(model, benchmark, config, seed) jobs:  {summary['jobs']}")
    if list_cells:
        for b, ids in summary["configs"].items():
            typer.echo(f"{b}: {' '.join(ids)}")


@app.command()
def certify(
    scores: Path = typer.Argument(..., help="long score table (CSV or Parquet): model, benchmark, config, score "
                                  "[, item for item-level input]"),
    as_json: bool = typer.Option(False, "--json", help="JSON output"),
    out: Optional[Path] = typer.Option(None, "--out", help="also write pairs.csv, benchmarks.csv and certify.json here"),
    config_cols: Optional[str] = typer.Option(None, "--config-cols",
                                              help="comma-separated axis columns that replace the 'config' column"),
    drop_incomplete: bool = typer.Option(False, "--drop-incomplete",
                                         help="drop configs missing for some model (for every model) instead of failing"),
    tol: Optional[float] = typer.Option(None, "--tol", help="score differences with |d| <= tol count as ties, for "
                                        "every quantity; without it, values equal within 1e-12 relative tie"),
    alpha: float = typer.Option(0.05, "--alpha", help="family-wise significance level (item-level input)"),
    samples: Optional[int] = typer.Option(None, "--samples", "--bootstrap-samples",
                                          help="resampling draws (item-level input); default: enough for every "
                                               "corrected p to reach alpha (docs/VERDICTS.md)"),
    seed: int = typer.Option(0, "--seed", "--bootstrap-seed", help="resampling seed (>= 0)"),
    family: str = typer.Option("pair", "--family", help="multiplicity family: pair | benchmark | table"),
    correction: str = typer.Option("maxt", "--correction", help="maxt (step-down max-T) | holm"),
    nominal: Optional[str] = typer.Option(None, "--nominal",
                                          help="config id (axis values joined by '-'): report the nearest "
                                               "reversing configuration from it (needs --config-cols)"),
):
    """Compute N+/N-/N0, rho_flip, ceiling, D1/D2, orderings reachable and tau_R for a score table;
    with an 'item' column also the item-level significance (rho_flip_sig, crossover test, item bootstrap)."""
    from .certify import certify as run, to_json, to_text  # deferred: pandas
    from .io import write_csv  # deferred: pyarrow

    cols = [c.strip() for c in config_cols.split(",")] if config_cols else None
    if out is not None and out.exists() and not out.is_dir():
        raise WriteError(out, "--out names a folder to write pairs.csv, benchmarks.csv and certify.json "
                              "into, and a file of that name exists")
    res = run(scores, cols, drop_incomplete, tol, alpha=alpha, samples=samples, seed=seed,
              nominal=nominal, family=family, correction=correction)
    for w in res.warnings:
        typer.echo(f"warning: {terminal_safe(w)}", err=True)
    text = to_json(res) if as_json else to_text(_terminal_safe_result(res))   # JSON escapes by itself
    typer.echo(text)
    if out is not None:
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise WriteError(out, exc.strerror or str(exc)) from exc
        write_csv(res.pairs, out / "pairs.csv")
        write_csv(res.summary, out / "benchmarks.csv")
        atomic_write_text(out / "certify.json", to_json(res))
        for name, table in (res.significance or {}).items():
            write_csv(table, out / f"{name}.csv")
        if res.reversal is not None:
            write_csv(res.reversal, out / "nearest_reversal.csv")


def _terminal_safe_result(res):
    """certify's result with every name from the input file terminal-safe (for the text view)."""
    return dataclasses.replace(
        res, pairs=frame_terminal_safe(res.pairs), summary=frame_terminal_safe(res.summary),
        reversal=None if res.reversal is None else frame_terminal_safe(res.reversal),
        significance=None if res.significance is None else {k: frame_terminal_safe(v)
                                                             for k, v in res.significance.items()},
        dropped_configs={terminal_safe(b): [terminal_safe(c) for c in v] for b, v in res.dropped_configs.items()},
        nominal=None if res.nominal is None else terminal_safe(res.nominal))


@app.command("run-cell")
def run_cell(
    config_path: Path = typer.Option(..., "--config", help="run config YAML"),
    model: str = typer.Option(..., "--model"),
    benchmark: str = typer.Option(..., "--benchmark"),
    config_id: str = typer.Option(..., "--config-id", help="envelope point, e.g. T2-t0.3-k3-freeform"),
    seed: int = typer.Option(0, "--seed"),
    out: Path = typer.Option(..., "--out", help="shard path (.parquet), written atomically"),
    variant: str = typer.Option("main", "--variant",
                                help="main, or bf16 (the precision check: the model in bf16)"),
    worker: bool = typer.Option(False, "--worker/--no-worker",
                                help="run inside the persistent per-model worker (started if needed)"),
):
    """Run one (model, benchmark, config, seed) cell and write its Parquet shard."""
    if not config_path.is_file():
        raise ConfigError(config_path, None, "file not found")
    if worker:
        from .cell_client import run_cell_via_worker  # deferred: the worker client, ~6 ms of start-up

        summary = run_cell_via_worker(config_path=str(config_path.resolve()), model=model, benchmark=benchmark,
                                      config_id=config_id, seed=seed, out=str(out.resolve()), variant=variant)
    else:
        from .cells import run_cell as run  # deferred: numpy/pyarrow, torch when run
        from .plan import Plan  # deferred: ~30 ms of CLI start-up (tasks, fingerprints)

        plan = Plan(load_config(config_path))
        summary = run(plan.cell_request(model, benchmark, config_id, seed, out, variant))
    typer.echo(json.dumps(summary))


@app.command()
def aggregate(
    config_path: Path = typer.Option(..., "--config", help="run config YAML"),
    variant: str = typer.Option("main", "--variant", help="main, or bf16 for the precision check"),
    out_dir: Path = typer.Option(..., "--out-dir"),
    inputs: Path = typer.Option(None, "--inputs",
                                help="the shards and item files to read (JSON, as the workflow writes "
                                     "it); default: the config's plan"),
):
    """Score every shard (re-parsing raw outputs) into the cell-score grid and item results."""
    from .aggregate import write_aggregate  # deferred: pandas/pyarrow

    cfg = load_config(config_path)
    if inputs is None:
        from .plan import Plan  # deferred: ~30 ms of CLI start-up (tasks, fingerprints)

        listed = Plan(cfg).aggregate_inputs(variant)
    else:
        listed = read_inputs(inputs)
        if listed.variant != variant:
            raise ShardError(f"{inputs} lists the {listed.variant} shards, not the {variant} ones")
    paths = write_aggregate(cfg, listed, out_dir)
    typer.echo(json.dumps(paths, indent=2))


@app.command("rho-flip")
def rho_flip_table(
    cell_scores: Path = typer.Argument(..., help="cell_scores.parquet from `aggregate`"),
    out: Path = typer.Option(..., "--out", help="pairwise table (.parquet); a .csv is written beside it"),
):
    """Per benchmark and model pair: N+, N-, N0, |C|, rho_flip, ceiling, saturated, D1, D2."""
    from .metrics.tables import write_pairwise_table  # deferred: pandas/pyarrow

    pairs = write_pairwise_table(cell_scores, out)
    typer.echo(pairs.to_string(index=False))


def _register_subcommands() -> None:
    """Commands defined next to the code they drive (each module imports lazily)."""
    items_cmd(app)
    models_cmd(app)
    analysis_cmd(app)
    worker_cmd(app)
    import_cmd(app)
    cross_package_cmd(app)


_register_subcommands()


def command():
    """The click command of :data:`app`, with every boolean flag shown as a bare flag in the
    help (typer 0.29 prints ``--json <bool>`` for flags that take no value)."""
    cmd = typer.main.get_command(app)
    _bare_flags(cmd, typer.Context(cmd))
    return cmd


def _bare_flags(cmd, ctx) -> None:
    for param in [*cmd.params, cmd.get_help_option(ctx)]:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
    for name, sub in getattr(cmd, "commands", {}).items():
        _bare_flags(sub, typer.Context(sub, parent=ctx, info_name=name))


def main(argv: list[str] | None = None) -> int:
    """The one error boundary: a usage error (missing option, unknown command, bad value) and
    a SafetyReproError (bad input) print one line on stderr and exit 2."""
    try:
        rc = command().main(args=argv, prog_name="safetyrepro", standalone_mode=False)
    except SafetyReproError as exc:
        typer.echo(f"error: {exc}", err=True)
        return 2
    except NoArgsIsHelpError as exc:  # a bare group: its help
        exc.show()
        return 2
    except typer.TyperException as exc:  # usage errors (typer bundles its own click)
        ctx = getattr(exc, "ctx", None)
        where = f"{ctx.command_path}: " if ctx is not None else ""
        hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
        message = " ".join(exc.format_message().split())
        typer.echo(f"error: {where}{message}{hint}", err=True)
        return 2
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort:
        typer.echo("aborted", err=True)
        return 1
    return rc if isinstance(rc, int) else 0


if __name__ == "__main__":
    sys.exit(main())
