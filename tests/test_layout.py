"""The packages of app/ depend on each other one way: no two import each other, directly or
through others (a module's own package, and imports inside functions, count too)."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

import app

APP = Path(app.__file__).parent


def unit_of(module: str) -> str | None:
    """The package (or top-level module) of app/ that a dotted module name belongs to."""
    parts = module.split(".")
    return parts[1] if parts[0] == "app" and len(parts) > 1 else None


def dependencies(root: Path) -> dict[str, set[str]]:
    """Each unit of the tree under `root` (named as under app/) and the units it imports."""
    graph: dict[str, set[str]] = {}
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root).parts
        unit = relative[0].removesuffix(".py")
        imported = graph.setdefault(unit, set())
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: Iterable[str] = ()
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module is not None and not node.level:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            imported |= {u for name in names if (u := unit_of(name)) and u != unit}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one unit (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(unit: str) -> None:
        index[unit] = low[unit] = len(index)
        stack.append(unit)
        for other in sorted(graph.get(unit, ())):
            if other not in index:
                visit(other)
                low[unit] = min(low[unit], low[other])
            elif other in stack:
                low[unit] = min(low[unit], index[other])
        if low[unit] == index[unit]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == unit:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for unit in sorted(graph):
        if unit not in index:
            visit(unit)
    return found


def test_the_check_sees_a_circle_through_a_third_package(tmp_path: Path) -> None:
    for package, imports in {"a": "app.b.x", "b": "app.c", "c": "app.a.y"}.items():
        (tmp_path / package).mkdir()
        (tmp_path / package / "m.py").write_text(f"def f():\n    import {imports}\n")
    assert cycles(dependencies(tmp_path)) == [["a", "b", "c"]]


def test_no_package_circle() -> None:
    graph = dependencies(APP)
    assert {"core", "db", "services", "api", "eventlog", "worker"} <= set(graph)
    assert cycles(graph) == []
