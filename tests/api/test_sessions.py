"""Sessions API: create, read, list (cursor pages, metadata filter), patch, delete."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import fields

import httpx
import pytest

from app.api.schemas import SessionConfig
from app.config import DEFAULT_LOCAL_MODEL, Settings
from app.core import sessions
from testkit.api import append, append_texts, message, new_session
from tests.conftest import api_with


async def test_create_and_read(client: httpx.AsyncClient) -> None:
    config = {
        "model": "anthropic:claude-haiku-4-5",
        "system_prompt": "Be brief.",
        "context_policy": {"max_input_tokens": 8000},
        "tools": [{"name": "get_weather", "parameters": {"type": "object"}}],
    }
    created = await new_session(client, title="t", metadata={"user": "42"}, config=config)
    fetched = (await client.get(f"/v1/sessions/{created['id']}")).json()
    assert fetched == created
    assert fetched["status"] == "idle" and fetched["rev"] == 0
    assert fetched["usage"] == {
        "input_tokens": 0,
        "output_tokens": 0,
        "cached_tokens": 0,
        "cache_write_tokens": 0,
        "reasoning_tokens": 0,
        "cost_usd": 0.0,
    }
    assert fetched["config"]["tools"][0]["kind"] == "client"  # defaults are filled in
    assert (fetched["parent_id"], fetched["fork_seq"]) == (None, None)


async def test_an_untitled_session_is_named_by_its_first_user_message(
    client: httpx.AsyncClient,
) -> None:
    """Server-side, whoever appends it (the CLI chat, the clients, an import): the page's
    session list then shows what each one is about rather than "Untitled session"."""

    async def title(sid: str) -> str | None:
        return (await client.get(f"/v1/sessions/{sid}")).json()["title"]  # type: ignore[no-any-return]

    sid = (await new_session(client))["id"]
    await append(
        client,
        sid,
        message("You are terse.", role="system"),
        {
            "kind": "message",
            "payload": {
                "role": "user",
                "content": [{"type": "image_url", "url": "https://example.com/a.png"}],
            },
        },
    )
    assert await title(sid) is None  # no words of the user's yet
    await append_texts(client, sid, "  Weather in\n Oslo   tomorrow?  ", "And Bergen?")
    assert await title(sid) == "Weather in Oslo tomorrow?"
    await append_texts(client, sid, "Something else entirely")
    assert await title(sid) == "Weather in Oslo tomorrow?"  # the first one names it

    long = "Plan a three week trip through Norway, Sweden and Finland by train in late spring"
    sid = (await new_session(client))["id"]
    await append_texts(client, sid, long)
    assert await title(sid) == "Plan a three week trip through Norway, Sweden and Finland by…"

    named = (await new_session(client, title="Trip planning"))["id"]
    await append_texts(client, named, "Weather in Oslo?")
    assert await title(named) == "Trip planning"  # a title given is kept


async def test_list_is_newest_first_with_cursor_pages(client: httpx.AsyncClient) -> None:
    ids = [(await new_session(client, title=str(i)))["id"] for i in range(7)]
    seen: list[str] = []
    cursor = None
    while True:
        params: dict[str, str | int] = {"limit": 3}
        if cursor:
            params["cursor"] = cursor
        page = (await client.get("/v1/sessions", params=params)).json()
        seen += [s["id"] for s in page["data"]]
        cursor = page["next_cursor"]
        assert page["has_more"] == (cursor is not None)
        if not cursor:
            break
    assert seen == list(reversed(ids))


async def test_list_filters_by_metadata(client: httpx.AsyncClient) -> None:
    a = await new_session(client, metadata={"user": "1", "plan": "pro"})
    await new_session(client, metadata={"user": "2", "plan": "pro"})
    await new_session(client, metadata={"user": "1"})
    response = await client.get(
        "/v1/sessions", params=[("metadata", "user:1"), ("metadata", "plan:pro")]
    )
    assert [s["id"] for s in response.json()["data"]] == [a["id"]]
    bad = await client.get("/v1/sessions", params={"metadata": "no-colon"})
    assert bad.status_code == 422 and bad.json()["error"]["code"] == "invalid_metadata_filter"


async def test_patch_merges_metadata_and_config(client: httpx.AsyncClient) -> None:
    session = await new_session(
        client,
        title="old",
        metadata={"a": "1", "b": "2"},
        config={"model": "openai:gpt-4o", "system_prompt": "x"},
    )
    response = await client.patch(
        f"/v1/sessions/{session['id']}",
        json={
            "title": "new",
            "metadata": {"a": None, "c": "3"},
            "config": {"system_prompt": None, "model": "openai:o3"},
        },
    )
    assert response.status_code == 200, response.text
    patched = response.json()
    assert patched["title"] == "new"
    assert patched["metadata"] == {"b": "2", "c": "3"}
    assert patched["config"] == {"model": "openai:o3"}
    assert patched["updated_at"] > session["updated_at"]
    untouched = (await client.patch(f"/v1/sessions/{session['id']}", json={})).json()
    assert (untouched["title"], untouched["metadata"]) == ("new", {"b": "2", "c": "3"})


def test_the_stored_config_holds_every_field_the_api_accepts() -> None:
    """A field the API accepted but the stored config did not know would be dropped on read,
    and lost at the next PATCH or fork."""
    assert [f.name for f in fields(sessions.SessionConfig)] == list(SessionConfig.model_fields)


async def test_every_config_field_survives_a_patch_and_a_fork(client: httpx.AsyncClient) -> None:
    config = {
        "model": "anthropic:claude-sonnet-4-5",  # one that can reason
        "fallback_model": "anthropic:claude-haiku-4-5",
        "summarization_model": "openai:gpt-4o-mini",
        "system_prompt": "Be brief.",
        "max_output_tokens": 256,
        "temperature": 0.5,
        "context_policy": {"preset": "short_context", "include_kinds": ["message"]},
        "tools": [],
        "run_policy": {"max_iterations": 3, "tools_deny": ["calculator"], "on_denied": "stop"},
        "memory_namespace": "notes",
        "reasoning": {"effort": "low"},
    }
    created = await new_session(client, config=config)
    assert created["config"] == config
    patched = await client.patch(
        f"/v1/sessions/{created['id']}", json={"config": {"system_prompt": "Be kind."}}
    )
    assert patched.json()["config"] == {**config, "system_prompt": "Be kind."}
    fork = await client.post(f"/v1/sessions/{created['id']}/fork", json={})
    assert fork.status_code == 201, fork.text
    assert fork.json()["config"] == {**config, "system_prompt": "Be kind."}


async def test_patch_cannot_exceed_metadata_limit(client: httpx.AsyncClient) -> None:
    session = await new_session(client, metadata={f"k{i}": "v" for i in range(16)})
    response = await client.patch(
        f"/v1/sessions/{session['id']}", json={"metadata": {"one-more": "v"}}
    )
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "invalid_metadata"


async def test_delete(client: httpx.AsyncClient) -> None:
    session = await new_session(client)
    await append_texts(client, session["id"], "x")
    assert (await client.delete(f"/v1/sessions/{session['id']}")).status_code == 204
    assert (await client.get(f"/v1/sessions/{session['id']}")).status_code == 404
    assert (await client.delete(f"/v1/sessions/{session['id']}")).status_code == 404
    assert (await client.get(f"/v1/sessions/{session['id']}/entries")).status_code == 404


async def test_entries_filter_by_kind(client: httpx.AsyncClient) -> None:
    session = await new_session(client)
    sid = session["id"]
    body = {
        "entries": [
            {"kind": "message", "payload": {"role": "user", "content": "weather?"}},
            {
                "kind": "tool_call",
                "payload": {"name": "w", "arguments": {"city": "Oslo"}},
                "refs": {"tool_call_id": "t1"},
            },
            {
                "kind": "tool_result",
                "payload": {"name": "w", "content": {"temp": 3}},
                "refs": {"tool_call_id": "t1"},
            },
            {"kind": "message", "payload": {"role": "assistant", "content": "3 degrees"}},
        ]
    }
    assert (await client.post(f"/v1/sessions/{sid}/entries", json=body)).status_code == 201
    page = (
        await client.get(
            f"/v1/sessions/{sid}/entries", params=[("kinds", "tool_call"), ("kinds", "tool_result")]
        )
    ).json()
    assert [(e["seq"], e["kind"]) for e in page["data"]] == [(2, "tool_call"), (3, "tool_result")]
    assert page["data"][0]["refs"] == {"tool_call_id": "t1"}
    assert page["rev"] == 4


async def test_service_written_kinds_cannot_be_appended(client: httpx.AsyncClient) -> None:
    session = await new_session(client)
    forged = {"entries": [{"kind": "run_end", "payload": {"run_id": "r", "status": "completed"}}]}
    response = await client.post(f"/v1/sessions/{session['id']}/entries", json=forged)
    assert response.status_code == 422


@pytest.fixture
async def keyless(
    settings: Settings, new_key: Callable[[], Awaitable[str]]
) -> AsyncIterator[httpx.AsyncClient]:
    """A client of an API configured with no provider key, one compat endpoint."""
    async with api_with(
        settings, new_key, compat_endpoints={"vllm": "http://127.0.0.1:9/v1"}
    ) as client:
        yield client


async def test_a_model_of_an_unconfigured_provider_is_refused(keyless: httpx.AsyncClient) -> None:
    refused = await keyless.post("/v1/sessions", json={"config": {"model": "openai:gpt-4o-mini"}})
    assert refused.status_code == 422
    error = refused.json()["error"]
    assert error["code"] == "provider_not_configured"
    assert error["details"]["loc"] == ["body", "config", "model"]
    assert error["details"]["configured"] == ["compat:vllm", "local"]
    assert "THREADLINE_OPENAI_API_KEY" in error["message"]
    assert "compat:vllm, local" in error["message"]

    fallback = {"model": "local:x", "fallback_model": "anthropic:claude-haiku-4-5"}
    refused = await keyless.post("/v1/sessions", json={"config": fallback})
    assert refused.status_code == 422
    assert refused.json()["error"]["details"]["loc"] == ["body", "config", "fallback_model"]
    assert (await keyless.get("/v1/sessions")).json()["data"] == []  # nothing was created

    created = await keyless.post("/v1/sessions", json={"config": {"model": "compat:vllm/q"}})
    assert created.status_code == 201
    sid = created.json()["id"]
    patch = {"config": {"summarization_model": "compat:other"}}
    refused = await keyless.patch(f"/v1/sessions/{sid}", json=patch)
    assert refused.status_code == 422
    assert refused.json()["error"]["details"]["loc"] == ["body", "config", "summarization_model"]
    kept = (await keyless.get(f"/v1/sessions/{sid}")).json()["config"]
    assert "summarization_model" not in kept  # the session is unchanged
    patched = await keyless.patch(f"/v1/sessions/{sid}", json={"config": {"model": "local:y"}})
    assert patched.status_code == 200 and patched.json()["config"]["model"] == "local:y"


async def test_with_no_key_sessions_default_to_the_local_model(
    keyless: httpx.AsyncClient,
) -> None:
    created = (await keyless.post("/v1/sessions", json={})).json()
    context = await keyless.get(f"/v1/sessions/{created['id']}/context")
    assert context.status_code == 200
    assert context.json()["model"] == DEFAULT_LOCAL_MODEL


async def test_list_filters_by_title_text(client: httpx.AsyncClient) -> None:
    """`q`: the title contains it, case-insensitively; LIKE's wildcards are plain characters."""
    pancakes = await new_session(client, title="Recipes: Pancakes")
    percent = await new_session(client, title="100% sure_thing")
    await new_session(client, title="Weather")
    await new_session(client)  # no title: never matches

    async def found(q: str) -> list[str]:
        response = await client.get("/v1/sessions", params={"q": q})
        assert response.status_code == 200, response.text
        return [s["id"] for s in response.json()["data"]]

    assert await found("pancake") == [pancakes["id"]]
    assert await found("RECIPES: PAN") == [pancakes["id"]]
    assert await found("%") == [percent["id"]]
    assert await found("e_t") == [percent["id"]]  # `_` is not any character
    assert await found("nothing like it") == []
    empty = await client.get("/v1/sessions", params={"q": ""})
    assert empty.status_code == 422


async def test_list_filters_by_parent(client: httpx.AsyncClient) -> None:
    """`parent_id`: the session's forks (its branches), newest first; pages and other filters
    apply as to any list."""
    parent = await new_session(client, title="root")
    await append_texts(client, parent["id"], "a", "b")
    forks = [
        (await client.post(f"/v1/sessions/{parent['id']}/fork", json=body)).json()
        for body in ({"at_seq": 1, "title": "one"}, {"at_seq": 2, "title": "two"})
    ]
    grandchild = (await client.post(f"/v1/sessions/{forks[0]['id']}/fork", json={})).json()
    listed = await client.get("/v1/sessions", params={"parent_id": parent["id"]})
    assert [s["id"] for s in listed.json()["data"]] == [forks[1]["id"], forks[0]["id"]]
    deeper = await client.get("/v1/sessions", params={"parent_id": forks[0]["id"]})
    assert [s["id"] for s in deeper.json()["data"]] == [grandchild["id"]]
    both = await client.get("/v1/sessions", params={"parent_id": parent["id"], "q": "TWO"})
    assert [s["id"] for s in both.json()["data"]] == [forks[1]["id"]]
    none = await client.get("/v1/sessions", params={"parent_id": grandchild["id"]})
    assert none.json()["data"] == []
    bad = await client.get("/v1/sessions", params={"parent_id": "not-a-uuid"})
    assert bad.status_code == 422
