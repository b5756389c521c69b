"""Settings: with no provider key the default model is the embedded one; with a key, that
provider's model; an explicit THREADLINE_DEFAULT_MODEL always wins."""

from __future__ import annotations

import pytest

from app.config import (
    DEFAULT_ANTHROPIC_MODEL,
    DEFAULT_LOCAL_MODEL,
    DEFAULT_OPENAI_MODEL,
    Settings,
)


@pytest.fixture(autouse=True)
def no_threadline_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> None:
    import os

    for name in os.environ:
        if name.startswith("THREADLINE_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path_factory.mktemp("no-dotenv"))  # no .env file either


@pytest.mark.parametrize(
    ("environment", "expected"),
    [
        ({}, DEFAULT_LOCAL_MODEL),
        ({"THREADLINE_OPENAI_API_KEY": "sk-x"}, DEFAULT_OPENAI_MODEL),
        ({"THREADLINE_ANTHROPIC_API_KEY": "sk-ant-x"}, DEFAULT_ANTHROPIC_MODEL),
        (
            {"THREADLINE_OPENAI_API_KEY": "sk-x", "THREADLINE_ANTHROPIC_API_KEY": "sk-ant-x"},
            DEFAULT_OPENAI_MODEL,
        ),
        ({"THREADLINE_OPENAI_API_KEY": ""}, DEFAULT_LOCAL_MODEL),  # an empty key is no key
        # compose passes unset variables through as empty ones
        (
            {"THREADLINE_OPENAI_API_KEY": "sk-x", "THREADLINE_DEFAULT_MODEL": ""},
            DEFAULT_OPENAI_MODEL,
        ),
        (
            {"THREADLINE_OPENAI_API_KEY": "sk-x", "THREADLINE_DEFAULT_MODEL": "local:mine"},
            "local:mine",
        ),
    ],
)
def test_the_default_model_follows_the_configured_keys(
    monkeypatch: pytest.MonkeyPatch, environment: dict[str, str], expected: str
) -> None:
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert Settings().default_model == expected


def test_the_direct_url_is_the_database_url_unless_one_is_set() -> None:
    pooled, direct = "postgresql://app@pgbouncer:6432/db", "postgresql://app@postgres:5432/db"
    assert Settings(_env_file=None, database_url=pooled).direct_url == pooled
    both = Settings(_env_file=None, database_url=pooled, direct_database_url=direct)
    assert both.direct_url == direct
    assert both.sqlalchemy_url == "postgresql+asyncpg://app@pgbouncer:6432/db"
