"""app/core is pure: it imports nothing that does I/O, nor anything from app/ outside core/."""

from __future__ import annotations

import ast
from pathlib import Path

CORE = Path(__file__).resolve().parents[2] / "app" / "core"

# Standard-library and third-party modules the pure core may use: computation only.
ALLOWED = {
    "__future__",
    "collections",
    "dataclasses",
    "enum",
    "functools",
    "itertools",
    "json",
    "math",
    "re",
    "typing",
    "pydantic",
    "bisect",
    "hashlib",
    "hmac",  # signing stream tokens (app.core.stream_tokens)
    "operator",
    "decimal",
    "unicodedata",
    "base64",  # decoding inline images' headers (app.core.content)
    "binascii",
    "struct",
}


def imported_modules(path: Path) -> set[str]:
    modules: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module)
    return modules


def test_core_imports_no_io() -> None:
    offenders = {}
    for path in sorted(CORE.rglob("*.py")):
        bad = {
            m
            for m in imported_modules(path)
            if not (m.split(".")[0] in ALLOWED or m == "app.core" or m.startswith("app.core."))
        }
        if bad:
            offenders[path.name] = sorted(bad)
    assert offenders == {}


def test_the_check_catches_io(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("import socket\nfrom sqlalchemy import text\nfrom app.db import journal\n")
    assert imported_modules(sample) == {"socket", "sqlalchemy", "app.db"}
