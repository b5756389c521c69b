"""The README stays true to the code: every setting is documented, the commands come first."""

from __future__ import annotations

from pathlib import Path

from app.config import Settings

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_every_setting_is_documented() -> None:
    missing = [n for n in Settings.model_fields if f"`THREADLINE_{n.upper()}`" not in README]
    assert missing == []


def test_the_two_commands_come_first_and_ci_runs_the_test_one() -> None:
    head = README.splitlines()[:6]
    assert any(line.startswith("make run") for line in head)
    assert any(line.startswith("make test") for line in head)
    assert "make test" in (ROOT / ".ci" / "run").read_text().splitlines()[-1]
