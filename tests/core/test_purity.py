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
    "datetime",  # timestamps as values (app.core.sessions): core never reads the clock
    "unicodedata",
    "base64",  # decoding inline images' headers (app.core.content)
    "binascii",
    "struct",
    "jsonschema_rs",  # checking structured answers against their schema (app.core.output_schema)
    # A PDF's bytes parsed in memory (io.BytesIO, pypdf's reader): whether a document part is a
    # PDF and how many pages it has (app.core.content). Nothing is read from a file or socket.
    "io",
    "pypdf",
    # Schedules' due times (app.core.schedules): cron arithmetic on datetimes given to it, and
    # title templates parsed with string.Formatter.
    "croniter",
    "string",
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


CLOCK_READS = {"now", "utcnow", "today"}


def clock_reads(path: Path) -> list[int]:
    """Lines calling datetime's clock methods (datetime is allowed for timestamps as values)."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in CLOCK_READS
    ]


def test_core_never_reads_the_clock() -> None:
    offenders = {
        path.name: lines for path in sorted(CORE.rglob("*.py")) if (lines := clock_reads(path))
    }
    assert offenders == {}


def test_the_clock_check_catches_a_read(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("from datetime import UTC, datetime\n\nstamp = datetime.now(UTC)\n")
    assert clock_reads(sample) == [3]
