"""docs/ARCHITECTURE.md names only code that exists: every module path it names (`cells.py`,
`inference/decode.py`, `worker/`, in backticks or in the diagram) is a file or folder of
src/safetyrepro (or, for `config/`, `benchmarks/` and the like, of the repository), and every
dotted name in the diagram (`cells.run_cell`, `worker.client.run_in_worker`) imports from the
package. The names are read from the doc, so a module moved without the doc fails here."""

from __future__ import annotations

import importlib
import re

import pytest

from conftest import ROOT

DOC = ROOT / "docs" / "ARCHITECTURE.md"
PACKAGE = ROOT / "src" / "safetyrepro"

# A path: segments that start with a word character, joined by "/", ending in ".py" or "/", or
# holding a "/" (`data/envelope.yaml`); placeholders (`<model>`, `[_bf16]`) are not paths.
SEGMENT = r"\w[\w.-]*"
PATH = re.compile(rf"^{SEGMENT}(/{SEGMENT})*/?$")
# A dotted name in the diagram: module(.module)*.attribute, where the last part may end in "*".
DOTTED = re.compile(r"(?<![\w/.-])([a-z_][a-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*\.(?:[A-Za-z_][A-Za-z0-9_]*\*?|\*))")
FILE_SUFFIXES = (".py", ".yaml", ".md", ".parquet", ".smk", ".sh", ".json")


def _doc():
    text = DOC.read_text()
    diagram = "\n".join(re.findall(r"^```\n(.*?)^```", text, flags=re.S | re.M))
    return text, diagram


def _is_path(token: str) -> bool:
    return bool(PATH.match(token)) and ("/" in token or token.endswith(".py"))


def named_paths() -> list[str]:
    """Module and file paths the doc names: in backticks, and in the diagram. Paths under
    results/ are what a run writes, not code, and are left out."""
    text, diagram = _doc()
    tokens = set(re.findall(r"`([^`\s]+)`", text))
    tokens |= set(re.findall(rf"(?<![\w.])({SEGMENT}(?:/{SEGMENT})+/?)", diagram))
    return sorted(t for t in tokens if _is_path(t) and not t.startswith("results/"))


def dotted_names() -> list[str]:
    """Dotted module.attribute names of the diagram; file names (`config.yaml`) are not."""
    _, diagram = _doc()
    return sorted({t for t in DOTTED.findall(diagram) if not t.endswith(FILE_SUFFIXES)})


def test_the_doc_names_modules():
    # the parsers see the doc: a reformatting that hid the names would pass the checks below
    paths, dotted = named_paths(), dotted_names()
    assert len([p for p in paths if p.endswith(".py")]) >= 10 and any(p.endswith("/") for p in paths), paths
    assert len(dotted) >= 10, dotted


@pytest.mark.parametrize("path", named_paths())
def test_every_named_module_path_exists(path):
    where = [PACKAGE / path, ROOT / path]
    found = [p for p in where if (p.is_dir() if path.endswith("/") else p.is_file())]
    assert found, f"docs/ARCHITECTURE.md names `{path}`, which is neither in src/safetyrepro nor in the repository"


@pytest.mark.parametrize("name", dotted_names())
def test_every_dotted_name_of_the_diagram_imports(name):
    parts = name.removeprefix("safetyrepro.").split(".")
    module, n = None, len(parts)
    while n and module is None:
        try:
            module = importlib.import_module("safetyrepro." + ".".join(parts[:n]))
        except ModuleNotFoundError as exc:
            if not (exc.name or "").startswith("safetyrepro"):
                raise
            n -= 1
    assert module is not None, f"docs/ARCHITECTURE.md names `{name}`: no such module in safetyrepro"
    obj = module
    for i, part in enumerate(parts[n:]):
        if part.endswith("*"):
            prefix = part[:-1]
            assert any(a.startswith(prefix) for a in dir(obj)), \
                f"docs/ARCHITECTURE.md names `{name}`: {obj!r} has no attribute starting with {prefix!r}"
            break
        assert hasattr(obj, part), \
            f"docs/ARCHITECTURE.md names `{name}`: {'.'.join(['safetyrepro', *parts[:n + i]])} has no `{part}`"
        obj = getattr(obj, part)
