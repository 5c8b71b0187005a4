"""Every import inside a function says why it is not at the top: a ``# deferred: <reason>``
comment on the import's first or last line (a heavy or optional library, or a module a light
entry point must not load). Read from the sources with ``ast`` and ``tokenize``; nothing is
imported. Run as a script, it lists the imports that lack the comment."""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

from safetyrepro.provenance import CODE_GROUPS

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = "safetyrepro"
MARK = "# deferred:"

# hashed into every cell's fingerprint: a byte changed there reruns every model cell
EXEMPT = CODE_GROUPS["cell"]


def exempt(rel: str, group: dict = EXEMPT) -> bool:
    """Whether ``rel`` (a path under the package folder) is in the code ``group``."""
    def under(p: str) -> bool:
        return rel == p or rel.startswith(p.rstrip("/") + "/")
    return any(under(p) for p in group["paths"]) and not any(under(p) for p in group.get("exclude", ()))


def function_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """The import statements inside a function or lambda body, nested ones included."""
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if in_function and isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append(child)
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(tree, False)
    return found


def deferred_lines(source: str) -> set[int]:
    """Lines that carry a ``# deferred: <reason>`` comment."""
    return {tok.start[0] for tok in tokenize.generate_tokens(io.StringIO(source).readline)
            if tok.type == tokenize.COMMENT and tok.string.startswith(MARK) and tok.string[len(MARK):].strip()}


def undocumented(src: Path = SRC, group: dict = EXEMPT) -> list[str]:
    """``file:line: statement`` of every function-level import without the comment."""
    root = src / PACKAGE
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if exempt(rel, group):
            continue
        text = path.read_text(encoding="utf-8")
        marked = deferred_lines(text)
        for node in function_imports(ast.parse(text, str(path))):
            if node.lineno not in marked and node.end_lineno not in marked:
                out.append(f"{path.relative_to(src).as_posix()}:{node.lineno}: {ast.unparse(node)}")
    return out


def test_function_level_imports_say_why_they_are_deferred():
    missing = undocumented()
    assert not missing, ("imports inside functions without a '# deferred: <reason>' comment "
                         "(hoist them to the top, or say why not):\n" + "\n".join(missing))


def test_the_cell_code_is_exempt_and_nothing_else():
    assert exempt("cells.py") and exempt("requests.py")
    assert exempt("models/load.py") and exempt("inference/generate.py")
    for rel in ("models/prepare.py", "models/sources/hub.py", "models/cli.py", "inference/bench.py",
                "cli.py", "plan.py", "worker/client.py"):
        assert not exempt(rel), rel


def test_the_checker_finds_an_undocumented_import(tmp_path):
    pkg = tmp_path / PACKAGE
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("import json\n")
    (pkg / "a.py").write_text(
        "import os\n"
        "def f():\n"
        "    import torch  # deferred: heavy\n"
        "    from . import (\n"
        "        b,\n"
        "    )  # deferred: the comment on the last line counts\n"
        "    import json  # here: a comment that is not the marker\n"
        "    return lambda: __import__('x')\n"
        "class C:\n"
        "    import re\n"
        "    def m(self):\n"
        "        s = '# deferred: in a string'; import sys\n")
    (pkg / "sub" / "c.py").write_text("def g():\n    def h():\n        from .. import a\n    return h\n")
    (pkg / "cells.py").write_text("def run():\n    import torch\n")
    (pkg / "empty.py").write_text("def e():\n    import os  # deferred:\n")
    found = undocumented(tmp_path)
    assert [f.split(": ", 1)[0] for f in found] == [
        "safetyrepro/a.py:7", "safetyrepro/a.py:12", "safetyrepro/empty.py:2", "safetyrepro/sub/c.py:3"]
    assert found[0] == "safetyrepro/a.py:7: import json"
    # without the exemption the cell code is checked too
    assert "safetyrepro/cells.py:2: import torch" in undocumented(tmp_path, {"paths": ()})


if __name__ == "__main__":
    print("\n".join(undocumented()) or "every function-level import says why it is deferred")
