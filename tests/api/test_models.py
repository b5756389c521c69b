"""GET /v1/models: the default model and one for each configured provider; each is a model a
session may be created with."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import httpx

from app.config import DEFAULT_LOCAL_MODEL, Settings
from tests.conftest import api_with


async def offered(client: httpx.AsyncClient) -> tuple[str, list[tuple[str, str]]]:
    response = await client.get("/v1/models")
    assert response.status_code == 200, response.text
    body = response.json()
    return body["default_model"], [(m["id"], m["provider"]) for m in body["data"]]


async def test_with_no_configuration_the_local_model_alone(
    settings: Settings, new_key: Callable[[], Awaitable[str]]
) -> None:
    async with api_with(settings, new_key) as client:
        assert await offered(client) == (DEFAULT_LOCAL_MODEL, [(DEFAULT_LOCAL_MODEL, "local")])


async def test_each_configured_provider_is_offered_and_each_offer_is_accepted(
    settings: Settings, new_key: Callable[[], Awaitable[str]]
) -> None:
    configured = {
        "openai_api_key": "sk-test",
        "anthropic_api_key": "sk-ant-test",
        "compat_endpoints": {"vllm": "http://127.0.0.1:9/v1", "ollama/llama3": "http://h/v1"},
    }
    async with api_with(settings, new_key, **configured) as client:
        default, models = await offered(client)
        assert default == "openai:gpt-4o-mini"  # the first key's provider
        assert models == [
            ("openai:gpt-4o-mini", "openai"),
            ("anthropic:claude-haiku-4-5", "anthropic"),
            ("compat:ollama/llama3", "compat"),
            ("compat:vllm", "compat"),
            (DEFAULT_LOCAL_MODEL, "local"),
        ]
        for model, _ in models:
            created = await client.post("/v1/sessions", json={"config": {"model": model}})
            assert created.status_code == 201, created.text


async def test_an_explicit_default_model_comes_first(
    settings: Settings, new_key: Callable[[], Awaitable[str]]
) -> None:
    async with api_with(
        settings, new_key, anthropic_api_key="k", default_model="anthropic:claude-sonnet-4-5"
    ) as client:
        default, models = await offered(client)
        assert default == "anthropic:claude-sonnet-4-5"
        assert [m for m, _ in models] == [
            "anthropic:claude-sonnet-4-5",
            "anthropic:claude-haiku-4-5",
            DEFAULT_LOCAL_MODEL,
        ]


async def test_the_list_needs_a_key(make_client: Callable[[str | None], httpx.AsyncClient]) -> None:
    response = await make_client(None).get("/v1/models")
    assert response.status_code == 401
    assert response.json()["error"]["code"]
