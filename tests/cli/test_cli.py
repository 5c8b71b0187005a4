"""CLI conventions, for every registered command: a usage error (unknown option, missing
option or argument, a value of the wrong type) and bad input (a SafetyReproError) print one
line on stderr and exit 2; flags show as bare flags in the help; `--version`."""

from __future__ import annotations

import re

import pytest

from safetyrepro.cli import command, main


def _leaves(cmd, path=()):
    subs = getattr(cmd, "commands", None)
    if subs:
        for name, sub in subs.items():
            yield from _leaves(sub, (*path, name))
    else:
        yield path, cmd


COMMANDS = dict(_leaves(command()))
# commands that read no input file (they look at worker state): no bad-input case
NO_INPUT_FILE = {("worker", "serve"), ("worker", "stop"), ("worker", "status")}


def _id(path) -> str:
    return " ".join(path)


def _is_path(param) -> bool:
    return "Path" in param.bare_type()


def _required_args(cmd, tmp_path) -> list[str]:
    """Every required parameter filled: input paths that do not exist, outputs under tmp_path."""
    args = []
    for p in cmd.params:
        if not p.required:
            continue
        name = p.opts[0]
        if name in ("--out", "--out-dir", "--work"):
            value = str(tmp_path / "out" / "o.parquet")
        else:
            value = str(tmp_path / "missing" / "x.parquet") if _is_path(p) else "x"
        args += ([name] if name.startswith("-") else []) + [value]
    return args


def _run(capsys, argv) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def _one_error_line(err: str) -> str:
    lines = err.strip("\n").split("\n")
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    return lines[0]


def test_every_command_is_covered():
    assert len(COMMANDS) >= 25 and ("certify",) in COMMANDS and ("import", "lm-eval") in COMMANDS


@pytest.mark.parametrize("path", COMMANDS, ids=_id)
def test_unknown_option_is_one_line_exit_2(capsys, path):
    rc, _, err = _run(capsys, [*path, "--no-such-option"])
    line = _one_error_line(err)
    assert rc == 2 and "No such option: --no-such-option" in line and f"safetyrepro {_id(path)}" in line


@pytest.mark.parametrize("path", [p for p, c in COMMANDS.items() if any(x.required for x in c.params)], ids=_id)
def test_missing_required_is_one_line_exit_2(capsys, path):
    rc, _, err = _run(capsys, list(path))
    assert rc == 2 and re.search(r"Missing (option|argument)", _one_error_line(err))


NUMERIC = [(p, x.opts[0]) for p, c in COMMANDS.items() for x in c.params
           if x.opts and x.opts[0].startswith("--") and x.bare_type() in ("int", "float")]


@pytest.mark.parametrize("path,option", NUMERIC, ids=[f"{_id(p)} {o}" for p, o in NUMERIC])
def test_bad_value_type_is_one_line_exit_2(capsys, path, option):
    rc, _, err = _run(capsys, [*path, option, "abc"])
    assert rc == 2 and f"Invalid value for '{option}'" in _one_error_line(err)


def test_unknown_command_is_one_line_exit_2(capsys):
    rc, _, err = _run(capsys, ["no-such-command"])
    assert rc == 2 and "No such command 'no-such-command'" in _one_error_line(err)
    rc, _, err = _run(capsys, ["analyze", "no-such-command"])
    assert rc == 2 and "safetyrepro analyze: No such command" in _one_error_line(err)


BAD_INPUT = [p for p in COMMANDS if p not in NO_INPUT_FILE]
KNOWN_GAPS: dict = {}


@pytest.mark.parametrize("path", [pytest.param(p, marks=pytest.mark.xfail(strict=True, reason=KNOWN_GAPS[p]))
                                  if p in KNOWN_GAPS else p for p in BAD_INPUT], ids=_id)
def test_bad_input_is_one_line_exit_2(capsys, tmp_path, path):
    """A missing input file (or, without required inputs, a missing --config or events file) is
    a SafetyReproError: one line naming what is wrong (the file, or a value checked before the
    files are read), exit 2, and not a usage error (those name the command first)."""
    cmd = COMMANDS[path]
    args = _required_args(cmd, tmp_path)
    opts = {o for x in cmd.params for o in x.opts}
    missing = str(tmp_path / "missing" / "x.parquet")
    if not any(missing == a for a in args):
        name = "--config" if "--config" in opts else "--events"
        assert name in opts, f"{_id(path)}: no input to make bad"
        args += [name, missing]
    rc, _, err = _run(capsys, [*path, *args])
    line = _one_error_line(err)
    assert rc == 2 and not line.startswith("error: safetyrepro ")
    assert "missing" in line or "field" in line, line


@pytest.mark.parametrize("path", [(), *COMMANDS], ids=lambda p: _id(p) or "safetyrepro")
def test_help_shows_flags_bare(capsys, path):
    rc, out, _ = _run(capsys, [*path, "--help"])
    assert rc == 0 and "--help" in out
    assert "<bool>" not in out


def test_version(capsys):
    from safetyrepro import __version__

    rc, out, _ = _run(capsys, ["--version"])
    assert rc == 0 and re.fullmatch(rf"safetyrepro {re.escape(__version__)}\+\S+\.src[0-9a-f]{{12}}\n", out)


def test_bare_group_prints_its_help(capsys):
    rc, out, err = _run(capsys, ["analyze"])
    assert rc == 2 and "Usage: safetyrepro analyze" in out + err
