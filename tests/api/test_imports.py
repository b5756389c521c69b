"""The HTTP surfaces (app/api, app/openai_api) reach the workers only through the services:
they import nothing from app.worker (the ask hands its run over: app/services/handoff.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import app

APP = Path(app.__file__).parent
SURFACES = ("api", "openai_api")


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, wherever in it (functions too)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def test_the_check_sees_an_import_of_the_worker(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from app.worker import handoff\n")
    assert "app.worker.handoff" in imported_modules(module)


@pytest.mark.parametrize("package", SURFACES)
def test_a_surface_imports_nothing_from_the_worker(package: str) -> None:
    files = sorted((APP / package).rglob("*.py"))
    assert files
    offending = {
        str(path.relative_to(APP)): sorted(
            name for name in imported_modules(path) if name.split(".")[:2] == ["app", "worker"]
        )
        for path in files
    }
    assert {path: names for path, names in offending.items() if names} == {}
