"""Code version: which code produced a number. Package version, plus the git commit (and a
dirty flag) when running from a checkout, plus a hash over the package sources so that an
installed copy without git is still identifiable."""

from __future__ import annotations

import ast
import functools
import hashlib
import subprocess
from pathlib import Path

from . import __version__

PACKAGE_DIR = Path(__file__).resolve().parent


SOURCE_SUFFIXES = {".py", ".yaml", ".yml", ".json"}  # what counts as the package's code


def hash_files(rel_paths) -> str:
    """The one code hasher: sha256 over the package-relative path and bytes of each file."""
    h = hashlib.sha256()
    for rel in sorted(rel_paths):
        h.update(str(rel).encode() + b"\0")
        h.update((PACKAGE_DIR / rel).read_bytes())
    return h.hexdigest()


def source_files(*rel_paths: str, exclude: tuple[str, ...] = ()) -> tuple[str, ...]:
    """Package-relative paths of the code files under ``rel_paths`` (files or folders; ""
    is the whole package), without those under ``exclude``."""
    out = set()
    for rel in rel_paths:
        p = PACKAGE_DIR / rel
        for f in (sorted(p.rglob("*")) if p.is_dir() else [p]):
            r = f.relative_to(PACKAGE_DIR)
            if f.suffix not in SOURCE_SUFFIXES or "__pycache__" in f.parts or not f.is_file():
                continue
            if any(r == Path(x) or Path(x) in r.parents for x in exclude):
                continue
            out.add(str(r))
    return tuple(sorted(out))


@functools.lru_cache(maxsize=None)
def source_hash() -> str:
    """Hash of every code file of the package."""
    return hash_files(source_files(""))


@functools.lru_cache(maxsize=None)
def git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(PACKAGE_DIR), "rev-parse", "HEAD"],
            capture_output=True, text=True, timeout=5,
        )
        if out.returncode != 0:
            return None
        commit = out.stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(PACKAGE_DIR), "status", "--porcelain", "--", str(PACKAGE_DIR)],
            capture_output=True, text=True, timeout=5,
        ).stdout.strip()
        return commit + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def code_version() -> dict:
    """Provenance record of the running code."""
    return {
        "package_version": __version__,
        "git_commit": git_commit(),
        "source_sha256": source_hash(),
    }


def format_code_version(cv: dict) -> str:
    """The one short form of a :func:`code_version` record: version+commit[-dirty].src<hash>."""
    commit = cv.get("git_commit") or "nogit"
    dirty = "-dirty" if commit.endswith("-dirty") else ""
    return f"{cv.get('package_version')}+{commit[:12]}{dirty}.src{str(cv.get('source_sha256'))[:12]}"


def code_version_string() -> str:
    return format_code_version(code_version())


# ---- code groups: which code can change a cell's outputs, its prompts or the item files -----
#
# One declarative table. A group covers the code files under "paths" except those under
# "exclude". Tables are fingerprinted by their producer's import closure instead
# (:func:`code_fingerprint`, below); prompt text by each template's hash
# (:meth:`.tasks.Task.template_hash`); parsers by :attr:`.tasks.Task.parser_version`.
CODE_GROUPS: dict[str, dict] = {
    # the model outputs of a cell (not the parse: aggregation re-parses). Model preparation is
    # covered by the model's source in the cell fingerprint, and the shard layout by
    # shards.layout_hash (a reader's error message reruns no cell).
    "cell": {"paths": ("models", "inference", "cells.py", "requests.py"),
             "exclude": ("models/prepare.py", "models/sources", "models/cli.py", "inference/bench.py")},
    # the prompt rendering code (in every template hash, tasks.prompts.render_code_hash)
    "render": {"paths": ("tasks/prompts.py", "tasks/render.py")},
    # the item subsets and few-shot pools
    "items": {"paths": ("items",), "exclude": ("items/cli.py",)},
}


@functools.lru_cache(maxsize=None)
def group_fingerprint(group: str) -> str:
    """Fingerprint of a :data:`CODE_GROUPS` group."""
    spec = CODE_GROUPS[group]
    return hash_files(source_files(*spec["paths"], exclude=spec.get("exclude", ())))


# ---- code fingerprints: which code computes one output ---------------------------------------
#
# A table must be rebuilt when the code that computes it changes, and only then. The code of
# an output is its producer module (e.g. ``safetyrepro.analysis.tables``) and every package
# module that module imports, directly or through others, at the top or inside a function
# (read from the sources with ``ast``, so nothing is imported), plus the ``__init__.py`` of
# each package on the way and the data files (.yaml/.json) of every package folder whose code
# is in the set (task files are read by the code next to them). The workflow passes the
# fingerprint as a rule's ``params`` (Snakemake reruns the rule when it changes) and every
# output records it, so a reader can tell a table written by older code (:func:`stale_reason`).

_PACKAGE = __name__.rsplit(".", 1)[0]  # "safetyrepro"
_DATA_SUFFIXES = {".yaml", ".yml", ".json"}


def _module_file(module: str) -> Path | None:
    """The source file of a package module name, or None when it is not a package module."""
    parts = module.split(".")
    if parts[0] != _PACKAGE:
        return None
    base = PACKAGE_DIR.joinpath(*parts[1:])
    for cand in (base.with_suffix(".py") if len(parts) > 1 else None, base / "__init__.py"):
        if cand is not None and cand.is_file():
            return cand
    return None


def _file_module(path: Path) -> tuple[str, str]:
    """(module name, package name) of a source file of the package."""
    rel = path.relative_to(PACKAGE_DIR).with_suffix("")
    parts = [_PACKAGE, *rel.parts]
    if parts[-1] == "__init__":
        parts = parts[:-1]
        return ".".join(parts), ".".join(parts)
    return ".".join(parts), ".".join(parts[:-1])


@functools.lru_cache(maxsize=None)
def _imports(path: Path) -> frozenset[str]:
    """Package module names a source file imports (absolute or relative, anywhere in it)."""
    _, package = _file_module(path)
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                full = ".".join(base + ([node.module] if node.module else []))
            else:
                full = node.module or ""
            found.add(full)
            found.update(f"{full}.{a.name}" for a in node.names)  # "from . import grid"
    return frozenset(m for m in found if _module_file(m) is not None)


@functools.lru_cache(maxsize=None)
def code_files(*modules: str) -> tuple[str, ...]:
    """Package-relative paths of the code behind ``modules`` (see the section comment)."""
    todo, seen = list(modules), set()
    files: set[Path] = set()
    for m in modules:
        if _module_file(m) is None:
            raise ValueError(f"{m!r} is not a module of the {_PACKAGE} package")
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        f = _module_file(m)
        if f is None:
            continue
        files.add(f)
        parents = m.split(".")
        todo.extend(".".join(parents[:i]) for i in range(1, len(parents)))  # packages run first
        todo.extend(_imports(f))
    for folder in {f.parent for f in files}:
        files.update(p for p in folder.iterdir() if p.suffix in _DATA_SUFFIXES and p.is_file())
    return tuple(sorted(str(f.relative_to(PACKAGE_DIR)) for f in files))


@functools.lru_cache(maxsize=None)
def code_fingerprint(*modules: str) -> str:
    """Hash (:func:`hash_files`) of :func:`code_files` of ``modules``."""
    return hash_files(code_files(*modules))


def code_stamp(producer: str) -> dict:
    """The metadata fields that name the code an output was computed by."""
    return {"producer": producer, "code_fingerprint": code_fingerprint(producer)}


def stale_reason(meta: dict) -> str | None:
    """Why an output's metadata says it was not computed by the current code (itself, or one
    of the ``sources`` it records), or None when it was. An output without a code stamp
    (written before outputs were stamped) is stale; a source without one (a table from
    outside the pipeline, such as a hand-made cell-score table) is not checked."""
    records = [("", meta)] + [(f"source {s.get('path', '?')}: ", s) for s in meta.get("sources", [])
                              if isinstance(s, dict) and s.get("producer")]
    for prefix, rec in records:
        producer, fp = rec.get("producer"), rec.get("code_fingerprint")
        if not producer or not fp:
            return prefix + "no code fingerprint (written by code that did not stamp its outputs)"
        try:
            current = code_fingerprint(producer)
        except ValueError:
            return prefix + f"its producer {producer} no longer exists"
        if current != fp:
            return prefix + (f"written by {producer} at code fingerprint {fp[:12]}; the current code "
                             f"is {current[:12]}")
    return None
