"""The command-line arguments that several benchmark scripts share. Imports argparse only, so
a script's ``--help`` stays free of torch and the models."""

from __future__ import annotations

import argparse

DEFAULT_CONFIG = "config/config.yaml"


def bench_parser(doc: str) -> argparse.ArgumentParser:
    """A benchmark script's parser: the first paragraph of its docstring as the description,
    and ``--config`` (the run config whose models and items it times)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--config", default=DEFAULT_CONFIG)
    return ap


# The decode groups of bench_slice.py's slice, every model: benchmarks 20 and 21 time these
SLICE_DECODE_GROUPS = [f"{m}:{case}" for m in ("smollm2-135m", "qwen2.5-0.5b", "gemma3-270m")
                       for case in ("truthfulqa:T1:k0", "bbq:T4:k0", "xstest:T2:k5")]


def revisions_parser(doc: str, *, rounds: int | None = None, folders: bool = False) -> argparse.ArgumentParser:
    """The parser of a benchmark that runs two revisions of this project side by side:
    ``--baseline`` (required), ``--candidate`` (default HEAD), ``--python`` (default this
    project's ``.venv``) and, where ``rounds`` is given, ``--rounds``. ``folders``: either side
    may also be a work-tree folder, used as it is."""
    from ..paths import PROJECT_ROOT  # deferred: a script's --help needs only argparse

    either = " (or work-tree folder)" if folders else ""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--baseline", required=True, help=f"git revision{either} to compare against")
    ap.add_argument("--candidate", default="HEAD", help=f"git revision{either} (default HEAD)")
    ap.add_argument("--python", default=str(PROJECT_ROOT / ".venv" / "bin" / "python"),
                    help="the interpreter both sides run in (default: this project's .venv)")
    if rounds is not None:
        ap.add_argument("--rounds", type=int, default=rounds)
    return ap


def decode_group_parser(doc: str, cases: list[str], rounds: int = 2) -> argparse.ArgumentParser:
    """:func:`bench_parser` with the decode-group benchmarks' ``--cases`` (what
    :func:`safetyrepro.perf.workload.group_cases` reads), ``--rounds`` and ``--out``."""
    ap = bench_parser(doc)
    ap.add_argument("--cases", nargs="+", default=cases, help="MODEL:BENCHMARK:TEMPLATE:SHOTS")
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--out", default=None)
    return ap


def cell_bench_parser(doc: str, cells: list[str], rounds: int = 2) -> argparse.ArgumentParser:
    """:func:`bench_parser` with the arguments of the benchmarks that time whole cells of one
    benchmark through ``run_cell``: ``--benchmark``, ``--cells`` (config ids), ``--rounds``,
    ``--threads`` and ``--out``."""
    ap = bench_parser(doc)
    ap.add_argument("--benchmark", default="truthfulqa")
    ap.add_argument("--cells", nargs="+", default=cells)
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--out", default=None)
    return ap


def add_generation_args(ap: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The arguments of the benchmarks that call the generation functions on a model loaded in
    one dtype: ``--rounds`` (1), ``--batch-size``, ``--dtype``, ``--threads`` (1) and ``--out``."""
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--dtype", choices=["fp32", "bf16", "nf4"], default="fp32")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None)
    return ap
