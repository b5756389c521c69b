"""Who may import whom among the checkout's packages: bench/ and testkit/ never reach into tests/
(what they share lives in testkit/), and the service imports neither testkit/ nor bench/."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def imported_packages(path: Path) -> set[str]:
    """The top-level packages a module imports (absolute imports; relative ones stay home)."""
    packages: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            packages |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            packages.add(node.module.split(".")[0])
    return packages


def offenders(package: str, forbidden: set[str]) -> dict[str, list[str]]:
    found = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        bad = imported_packages(path) & forbidden
        if bad:
            found[str(path.relative_to(ROOT))] = sorted(bad)
    return found


def test_bench_and_testkit_never_import_tests() -> None:
    assert offenders("bench", {"tests"}) == {}
    assert offenders("testkit", {"tests", "bench"}) == {}


def test_the_service_imports_neither_testkit_nor_bench() -> None:
    assert offenders("app", {"tests", "testkit", "bench"}) == {}


def test_the_check_sees_every_form_of_import(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import tests.fakes\nfrom tests import helpers\nfrom testkit.upstream import Text\n"
        "from . import sibling\n"
    )
    assert imported_packages(sample) == {"tests", "testkit"}
