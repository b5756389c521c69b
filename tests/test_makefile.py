"""The Makefile's targets do what the README says they do and no more (dry runs: `make -n`)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def planned(target: str, tmp_path: Path) -> str:
    """The commands `make TARGET` would run from scratch (every file out of date), in a venv
    that does not exist yet."""
    if shutil.which("make") is None:
        pytest.fail("make is not installed")
    result = subprocess.run(
        ["make", "-n", "-B", target, f"VENV={tmp_path / 'venv'}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout


def test_each_client_needs_only_its_own_generator(tmp_path: Path) -> None:
    python = planned("client-python", tmp_path)
    assert '"openapi-python-client>=' in python and "clients/python/generate.py" in python
    # Not the service's packages (a llama.cpp build), the dev toolchain, nor Node.js.
    assert "pip install" in python and "-e " not in python and ".[" not in python
    assert "npm" not in python

    typescript = planned("client-typescript", tmp_path)
    assert "npm ci" in typescript and "npx tsc" in typescript
    assert "pip" not in typescript and "venv" not in typescript

    both = planned("clients", tmp_path)
    assert both == python + typescript
