"""The code's shape, checked: no import cycle between modules (function-level and
TYPE_CHECKING imports count), no access to another object's private members, no function
above cyclomatic complexity 20, no module over 600 lines. The layers and the engines'
purity are import-linter contracts in pyproject.toml (``lint-imports``, run by CI)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "compactstore"
SOURCES = sorted(PACKAGE.rglob("*.py"))
# Public names of namedtuples and SQLAlchemy rows, spelled with a leading underscore.
_PUBLIC_UNDERSCORED = frozenset({"_make", "_replace", "_asdict", "_fields", "_mapping"})

pytestmark = pytest.mark.slow


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycles() -> None:
    grimp = pytest.importorskip("grimp", reason="grimp comes with the test extra's import-linter")
    graph = grimp.build_graph("compactstore")
    edges = {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    assert _cycles(edges) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def _private_accesses(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute):
            continue
        name = node.attr
        if not name.startswith("_") or name.startswith("__") or name in _PUBLIC_UNDERSCORED:
            continue
        owner = ast.unparse(node.value)
        if owner in ("self", "cls", "super()"):
            continue
        found.append(f"line {node.lineno}: {owner}.{name}")
    return found


def test_no_module_reaches_into_another_objects_private_members() -> None:
    found = {
        str(path.relative_to(PACKAGE)): hits
        for path in SOURCES
        if (hits := _private_accesses(path.read_text(encoding="utf-8")))
    }
    assert found == {}


def test_the_private_access_check_sees_one() -> None:
    assert _private_accesses("store._read(1)\nself._ok()\nrow._replace(a=1)") == [
        "line 1: store._read"
    ]


def test_no_function_above_complexity_20() -> None:
    complexity = pytest.importorskip("radon.complexity", reason="radon comes with the test extra")
    visitors = pytest.importorskip("radon.visitors", reason="radon comes with the test extra")
    found = [
        f"{path.relative_to(PACKAGE)}:{block.lineno} {block.fullname} ({block.complexity})"
        for path in SOURCES
        for block in complexity.sorted_results(
            complexity.cc_visit(path.read_text(encoding="utf-8"))
        )
        if isinstance(block, visitors.Function) and block.complexity > 20
    ]
    assert found == []


def test_no_module_over_600_lines() -> None:
    found = {
        str(path.relative_to(PACKAGE)): lines
        for path in SOURCES
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > 600
    }
    assert found == {}


# What a user imports: the package itself and these modules; the rest is `_`-prefixed.
PUBLIC_MODULES = {
    "aio",
    "capabilities",
    "db",
    "errors",
    "formats",
    "integrations",
    "models",
    "pricing",
    "providers",
    "report",
    "summarizers",
    "transfer",
}


def test_the_public_top_level_modules_are_the_documented_twelve() -> None:
    public = {
        path.stem
        for path in PACKAGE.iterdir()
        if not path.name.startswith("_")
        and (path.suffix == ".py" or (path / "__init__.py").exists())
    }
    assert public == PUBLIC_MODULES
    assert len(PUBLIC_MODULES) <= 12


def test_the_examples_import_only_public_modules() -> None:
    """The examples are what users copy: they import compactstore's public names only."""
    examples = PACKAGE.parent / "examples"
    internal = {
        f"{path.name}:{number}"
        for path in sorted(examples.glob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"\bcompactstore\._", line)
    }
    assert internal == set()
