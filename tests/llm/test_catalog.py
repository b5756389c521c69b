"""Context windows: configured per compat endpoint, discovered from the server where it says
(llama.cpp's /props, over real HTTP from the fake upstream), read from the local GGUF."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.config import Settings
from app.llm import catalog
from app.llm.catalog import COMPAT_DEFAULT_WINDOW, context_window_for
from testkit.upstream import FakeUpstream


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream() as up:
        yield up


def compat(upstream: FakeUpstream, **endpoint: object) -> tuple[Settings, str]:
    """Settings with one compat endpoint under a fresh path (discoveries are kept per URL)."""
    url = f"{upstream.url}/{uuid.uuid4().hex}/v1"
    value: object = {"url": url, **endpoint} if endpoint else url
    return Settings(_env_file=None, compat_endpoints={"srv": value}), url


async def test_the_window_llama_cpp_reports_is_used(upstream: FakeUpstream) -> None:
    upstream.clear()
    upstream.serve_props({"default_generation_settings": {"n_ctx": 4096}, "total_slots": 1})
    settings, _ = compat(upstream)

    assert await context_window_for(settings, "compat:srv") == 4096
    assert await context_window_for(settings, "compat:srv/some-model") == 4096


async def test_a_configured_window_wins_over_the_server(upstream: FakeUpstream) -> None:
    upstream.clear()
    upstream.serve_props({"default_generation_settings": {"n_ctx": 4096}})
    settings, _ = compat(upstream, context_window=2048, max_output_tokens=256)

    assert await context_window_for(settings, "compat:srv") == 2048
    endpoint = settings.compat_endpoint("srv")
    assert endpoint is not None and endpoint.max_output_tokens == 256


async def test_a_server_that_says_nothing_gets_a_small_window_not_200k(
    upstream: FakeUpstream,
) -> None:
    upstream.clear()  # no /props, and the fake has no /models
    settings, url = compat(upstream)

    assert await context_window_for(settings, "compat:srv") == COMPAT_DEFAULT_WINDOW
    # Silence is asked again later, not kept for ever.
    assert catalog._DISCOVERED[url][0] is None
    upstream.serve_props({"n_ctx": 16384})
    catalog._DISCOVERED[url] = (None, 0.0)  # as if the retry interval had passed
    assert await context_window_for(settings, "compat:srv") == 16384


async def test_the_local_window_comes_from_the_gguf() -> None:
    # SmolLM2-135M-Instruct says llama.context_length = 8192 in its metadata.
    assert await context_window_for(Settings(_env_file=None), "local:anything") == 8192


async def test_a_local_model_that_cannot_be_read_still_gets_a_window(tmp_path: Path) -> None:
    """Projections (dry runs, session context) must not fail for it: the ask says unavailable."""
    settings = Settings(_env_file=None, local_model_path=tmp_path / "missing.gguf")

    assert await context_window_for(settings, "local:x") == catalog.LOCAL_FALLBACK_WINDOW


@pytest.mark.parametrize(
    ("model", "reasons"),
    [
        ("anthropic:claude-sonnet-4-5", True),
        ("anthropic:claude-opus-4-1-20250805", True),
        ("anthropic:claude-haiku-4-5", True),
        ("anthropic:claude-3-7-sonnet-latest", True),
        ("anthropic:claude-3-5-haiku-latest", False),
        ("anthropic:claude-test", False),
        ("openai:o3-mini", True),
        ("openai:gpt-5-mini", True),
        ("openai:gpt-5-chat-latest", False),
        ("openai:gpt-4o-mini", False),
        ("local:qwen", False),
        ("compat:nowhere", False),
    ],
)
def test_which_models_can_reason(model: str, reasons: bool) -> None:
    assert catalog.can_reason(Settings(_env_file=None), model) is reasons


def test_a_compat_endpoint_reasons_only_when_configured_to() -> None:
    settings = Settings(
        _env_file=None,
        compat_endpoints={
            "plain": "http://127.0.0.1:1/v1",
            "r1": {"url": "http://127.0.0.1:1/v1", "reasoning": True},
        },
    )

    assert not catalog.can_reason(settings, "compat:plain")
    assert catalog.can_reason(settings, "compat:r1")
    assert catalog.can_reason(settings, "compat:r1/deepseek-r1")


@pytest.mark.parametrize(
    ("api", "model", "responses"),
    [
        ("auto", "openai:o4-mini", True),
        ("auto", "openai:gpt-5-mini", True),
        ("auto", "openai:gpt-5-chat-latest", False),
        ("auto", "openai:gpt-4o-mini", False),
        ("responses", "openai:gpt-4o-mini", True),
        ("chat", "openai:o3", False),
        ("responses", "anthropic:claude-sonnet-4-5", False),
        ("responses", "compat:srv", False),
    ],
)
def test_the_responses_api_serves_reasoning_models_or_as_configured(
    api: str, model: str, responses: bool
) -> None:
    settings = Settings(_env_file=None, openai_api=api)
    assert catalog.uses_responses_api(settings, model) is responses
    sent = catalog.reasoning_sent_back(settings, model)
    if model.startswith("anthropic:"):
        assert sent == {"thinking", "redacted_thinking"}
    else:
        assert sent == ({"reasoning"} if responses else set())
