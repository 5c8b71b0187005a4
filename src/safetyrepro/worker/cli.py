"""``safetyrepro worker ...``: serve, stop, status, events-summary.

Hook: ``register(app)`` adds the ``worker`` command group to the main typer app."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from ..config import DEFAULTS
from ..errors import DataError
from ..paths import resolve
from .events import event_files, format_summary, summarize_events
from .layout import default_state_dir

IDLE_TIMEOUT_S = float(DEFAULTS["runtime"]["worker_idle_timeout_s"])

worker_app = typer.Typer(help="Persistent per-model worker processes (one per node and model).",
                         no_args_is_help=True)

STATE_DIR_HELP = "worker state dir (default: <results-dir>/.workers/<hostname>)"


def _state_dir(state_dir: Optional[Path], results_dir: Path) -> Path:
    return state_dir if state_dir is not None else default_state_dir(resolve(results_dir))


@worker_app.command("serve")
def serve_cmd(
    key: str = typer.Option(..., help="resource key this worker serves"),
    loader: str = typer.Option(..., help="module:function returning the state (e.g. the model)"),
    loader_arg: str = typer.Option("{}", help="JSON object of keyword arguments for the loader"),
    idle_timeout: float = typer.Option(IDLE_TIMEOUT_S, help="exit after this many seconds without calls"),
    slots: int = typer.Option(1, help="how many workers may hold the device at once"),
    detach: bool = typer.Option(False, help="fork into the background once listening"),
    state_dir: Optional[Path] = typer.Option(None, help=STATE_DIR_HELP),
    results_dir: Path = typer.Option(Path("results"), help="results dir (for the default state dir)"),
) -> None:
    """Run a worker in the foreground (clients normally start workers themselves)."""
    from .server import serve  # deferred: signal/logging/threading, ~12 ms of CLI start-up

    try:
        args = json.loads(loader_arg)
    except ValueError as exc:
        raise typer.BadParameter(f"not JSON: {exc}", param_hint="--loader-arg") from exc
    code = serve(_state_dir(state_dir, results_dir), key, loader, args, idle_timeout=idle_timeout,
                 slots=slots, detach=detach)
    raise typer.Exit(code)


@worker_app.command("stop")
def stop_cmd(
    key: Optional[str] = typer.Option(None, help="stop only this key's worker"),
    all_: bool = typer.Option(False, "--all", help="stop every worker in the state dir"),
    timeout: float = typer.Option(60.0, help="seconds to wait for a graceful exit before SIGKILL"),
    state_dir: Optional[Path] = typer.Option(None, help=STATE_DIR_HELP),
    results_dir: Path = typer.Option(Path("results"), help="results dir (for the default state dir)"),
) -> None:
    """Ask workers to finish their current call and exit."""
    from .lifecycle import stop_workers  # deferred: the worker client, ~7 ms of CLI start-up

    if (key is None) == (not all_):
        raise typer.BadParameter("give exactly one of --key K or --all")
    d = _state_dir(state_dir, results_dir)
    for row in stop_workers(d, key=key, timeout=timeout):
        typer.echo(f"{row['key']}\tpid {row['pid']}\t{row['outcome']}")


@worker_app.command("status")
def status_cmd(
    state_dir: Optional[Path] = typer.Option(None, help=STATE_DIR_HELP),
    results_dir: Path = typer.Option(Path("results"), help="results dir (for the default state dir)"),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
) -> None:
    """List this node's workers."""
    from .lifecycle import worker_status  # deferred: the worker client, ~7 ms of CLI start-up

    d = _state_dir(state_dir, results_dir)
    rows = worker_status(d)
    if as_json:
        typer.echo(json.dumps(rows, indent=2, sort_keys=True, default=str))
        return
    if not rows:
        typer.echo(f"no workers in {d}")
    for r in rows:
        state = r.get("phase", "?") if r.get("alive") else "dead (stale pid file)"
        extra = f" calls={r['n_calls']} idle={r.get('idle_s', 0):.0f}s" if "n_calls" in r else ""
        typer.echo(f"{r.get('key')}\tpid {r.get('pid')}\t{state}{extra}")


@worker_app.command("events-summary")
def events_summary_cmd(
    events: Optional[list[Path]] = typer.Option(None, help="events.jsonl file(s); default: all "
                                                "nodes' files under <results-dir>/.workers/"),
    results_dir: Path = typer.Option(Path("results"), help="results dir"),
    since: Optional[float] = typer.Option(None, help="only events from this epoch time on"),
    wall: Optional[float] = typer.Option(None, help="wall seconds of the run (default: event span)"),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
) -> None:
    """Model loads per key and the share of wall time spent loading."""
    absent = [f for f in events or [] if not f.is_file()]
    if absent:
        raise DataError(absent[0], "events file not found")
    files = events or event_files(resolve(results_dir))
    summary = summarize_events(files, since=since, wall_seconds=wall)
    if as_json:
        typer.echo(json.dumps(summary, indent=2, sort_keys=True))
    else:
        typer.echo(format_summary(summary))


def register(app: typer.Typer) -> None:
    """Add the ``worker`` command group to the main CLI."""
    app.add_typer(worker_app, name="worker")

