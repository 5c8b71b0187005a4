"""The package's import graph has no cycle: read from the sources with ``ast`` (nothing is
imported), counting every import, at module level, inside a function or under
``TYPE_CHECKING``. Run as a script, it prints the cycles it finds."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = "safetyrepro"


def modules(src: Path = SRC) -> dict[str, tuple[Path, bool]]:
    """``{dotted name: (file, is a package __init__)}`` of every module of the package."""
    out = {}
    for path in sorted((src / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return out


def import_graph(src: Path = SRC) -> dict[str, dict[str, list[int]]]:
    """``{module: {imported package module: [line, ...]}}``. ``from X import name`` counts as
    importing the submodule ``X.name`` when there is one, else ``X``."""
    mods = modules(src)
    graph: dict[str, dict[str, list[int]]] = {}
    for name, (path, is_pkg) in mods.items():
        here = name if is_pkg else name.rpartition(".")[0]
        edges = graph.setdefault(name, {})
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here.split(".")[:len(here.split(".")) - node.level + 1]
                    base = ".".join(base + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for target in targets:
                if target in mods and target != name:
                    edges.setdefault(target, []).append(node.lineno)
    return graph


def cycles(graph: dict[str, dict[str, list[int]]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, 10 * len(graph) + 100))
    try:
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(old)
    return sorted(found)


def describe(graph, comp: list[str]) -> str:
    lines = [" <-> ".join(comp)]
    for a in comp:
        for b, at in sorted(graph[a].items()):
            if b in comp:
                lines.append(f"  {a} -> {b} (line {', '.join(map(str, at))})")
    return "\n".join(lines)


def test_no_import_cycle_among_package_modules():
    graph = import_graph()
    assert len(graph) > 50 and "safetyrepro.io" in graph["safetyrepro.shards"]
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(describe(graph, c) for c in found)


def test_the_checker_sees_function_level_and_type_checking_imports(tmp_path):
    pkg = tmp_path / PACKAGE
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..c import x\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n")
    (pkg / "d.py").write_text("import safetyrepro.a\n")
    graph = import_graph(tmp_path)
    assert graph["safetyrepro.a"] == {"safetyrepro.sub.b": [1]}
    assert graph["safetyrepro.sub.b"] == {"safetyrepro.c": [2]}
    assert graph["safetyrepro.d"] == {"safetyrepro.a": [1]}
    assert cycles(graph) == [["safetyrepro.a", "safetyrepro.c", "safetyrepro.sub.b"]]


def test_plan_and_models_do_not_import_each_other():
    """The plan (fingerprints) reads weights records from :mod:`safetyrepro.weights`, not from
    the models package, whose CLI builds a plan."""
    graph = import_graph()
    assert not any(m.startswith("safetyrepro.models") for m in graph["safetyrepro.plan"])
    assert "safetyrepro.plan" in graph["safetyrepro.models.cli"]


if __name__ == "__main__":
    g = import_graph()
    for c in cycles(g):
        print(describe(g, c))
