"""Text that is not Unicode: JSON may escape a lone surrogate ("\\ud800"), which is valid JSON but
no UTF-8 can hold (nor Postgres store). Every body that takes text refuses it with 422
invalid_unicode naming where it is, before anything is written; never a 500."""

from __future__ import annotations

import importlib
import json
import pkgutil
from types import ModuleType
from typing import Any

import httpx
import pytest
from fastapi import APIRouter
from fastapi.routing import APIRoute
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import app.api
from app.api.bodies import JSONRoute
from testkit.api import append_texts, history, message, new_session

LONE = "\ud800"
# (what, method, path under the session/run, body holding LONE, where it is in the body)
BODIES: list[tuple[str, str, str, dict[str, Any], list[Any]]] = [
    ("session title", "POST", "/v1/sessions", {"title": LONE}, ["title"]),
    ("metadata value", "POST", "/v1/sessions", {"metadata": {"k": LONE}}, ["metadata", "k"]),
    ("metadata key", "POST", "/v1/sessions", {"metadata": {LONE: "v"}}, ["metadata", "\\ud800"]),
    (
        "system prompt",
        "POST",
        "/v1/sessions",
        {"config": {"system_prompt": f"Be {LONE}brief."}},
        ["config", "system_prompt"],
    ),
    (
        "tool description",
        "POST",
        "/v1/sessions",
        {"config": {"tools": [{"name": "t", "description": LONE}]}},
        ["config", "tools", 0, "description"],
    ),
    ("patched title", "PATCH", "{session}", {"title": LONE}, ["title"]),
    ("patched metadata", "PATCH", "{session}", {"metadata": {"k": LONE}}, ["metadata", "k"]),
    ("fork title", "POST", "{session}/fork", {"title": LONE}, ["title"]),
    (
        "appended message",
        "POST",
        "{session}/entries",
        {"entries": [message(f"hi {LONE}")]},
        ["entries", 0, "payload", "content"],
    ),
    (
        "appended text part",
        "POST",
        "{session}/entries",
        {
            "entries": [
                {
                    "kind": "message",
                    "payload": {"role": "user", "content": [{"type": "text", "text": LONE}]},
                }
            ]
        },
        ["entries", 0, "payload", "content", 0, "text"],
    ),
    (
        "appended tool result (any JSON)",
        "POST",
        "{session}/entries",
        {
            "entries": [
                {
                    "kind": "tool_result",
                    "payload": {"content": {"rows": [{"x": LONE}]}},
                    "refs": {"tool_call_id": "t1"},
                }
            ]
        },
        ["entries", 0, "payload", "content", "rows", 0, "x"],
    ),
    ("ask input", "POST", "{session}/ask", {"input": LONE, "stream": False}, ["input"]),
    (
        "ask text part",
        "POST",
        "{session}/ask",
        {"input": [{"type": "text", "text": LONE}], "stream": False},
        ["input", 0, "text"],
    ),
    (
        "ask metadata",
        "POST",
        "{session}/ask",
        {"input": "hi", "metadata": {"k": LONE}, "stream": False},
        ["metadata", "k"],
    ),
    (
        "projection pending",
        "POST",
        "{session}/projection",
        {"pending": [message(LONE)]},
        ["pending", 0, "payload", "content"],
    ),
    ("compaction focus", "POST", "{session}/compact", {"focus": LONE}, ["focus"]),
    (
        "tool output",
        "POST",
        "{run}/tool_outputs",
        {"tool_outputs": [{"tool_call_id": "c1", "output": f"out {LONE}"}]},
        ["tool_outputs", 0, "output"],
    ),
    ("memory content", "PUT", "/v1/memory/notes", {"content": LONE}, ["content"]),
    (
        "memory new_string",
        "PATCH",
        "/v1/memory/notes",
        {"old_string": "a", "new_string": LONE},
        ["new_string"],
    ),
]


def raw_json(body: Any) -> bytes:
    """The body as a client writes it: json.dumps escapes the lone surrogate, so this is valid
    JSON (and ASCII); httpx's json= would fail to encode it."""
    return json.dumps(body).encode()


async def send(client: httpx.AsyncClient, method: str, url: str, body: Any) -> httpx.Response:
    return await client.request(
        method, url, content=raw_json(body), headers={"Content-Type": "application/json"}
    )


async def _targets(client: httpx.AsyncClient) -> dict[str, str]:
    """A session with history, a run of another one (queued: the in-process app runs no
    workers) and a memory, so that nothing but the surrogate stands in each request's way."""
    sid = (await new_session(client))["id"]
    await append_texts(client, sid, "first")
    busy = (await new_session(client))["id"]
    asked = await client.post(f"/v1/sessions/{busy}/ask", json={"input": "q", "stream": False})
    assert asked.status_code == 202, asked.text
    put = await client.put("/v1/memory/notes", json={"content": "a b"})
    assert put.status_code in (200, 201), put.text
    return {"session": f"/v1/sessions/{sid}", "run": f"/v1/runs/{asked.json()['id']}"}


def _assert_refused(response: httpx.Response, where: list[Any]) -> None:
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_unicode", error
    assert "surrogate" in error["message"] and "U+D800" in error["message"], error
    location = error["details"]["errors"][0]["loc"]
    assert location[0] == "body" and location[1 : len(where) + 1] == where, location


@pytest.mark.parametrize(
    ("method", "path", "body", "where"),
    [pytest.param(m, p, b, w, id=name) for name, m, p, b, w in BODIES],
)
async def test_a_lone_surrogate_anywhere_in_a_body_is_refused(
    client: httpx.AsyncClient, method: str, path: str, body: dict[str, Any], where: list[Any]
) -> None:
    targets = await _targets(client)
    sid = targets["session"].rsplit("/", 1)[1]
    before = await history(client, sid)
    _assert_refused(await send(client, method, path.format(**targets), body), where)
    assert await history(client, sid) == before  # nothing was written
    memory = await client.get("/v1/memory/notes")
    assert memory.json()["content"] == "a b"


@given(
    text=st.text(max_size=20),
    surrogate=st.integers(0xD800, 0xDFFF).map(chr),
    position=st.integers(0, 20),
)
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
async def test_a_lone_surrogate_in_pending_content_is_refused_wherever_it_is(
    client: httpx.AsyncClient, text: str, surrogate: str, position: int
) -> None:
    """Any lone surrogate (high or low), at any place in otherwise ordinary text; text whose
    surrogates all pair up (an emoji escaped as two) is ordinary text."""
    sid = (await new_session(client))["id"]
    at = min(position, len(text))
    bad = text[:at] + surrogate + text[at:]
    refused = await send(
        client, "POST", f"/v1/sessions/{sid}/projection", {"pending": [message(bad)]}
    )
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"]["code"] == "invalid_unicode"
    paired = await send(
        client, "POST", f"/v1/sessions/{sid}/projection", {"pending": [message(text + "😀")]}
    )
    assert paired.status_code == 200, paired.text
    assert paired.json()["request"]["messages"][-1]["content"] == text + "😀"


async def test_a_search_query_cannot_carry_a_surrogate(client: httpx.AsyncClient) -> None:
    """A query string is percent-encoded UTF-8: an encoded surrogate is invalid UTF-8, read as
    replacement characters; it matches nothing rather than failing."""
    sid = (await new_session(client))["id"]
    await append_texts(client, sid, "hello")
    found = await client.get(f"/v1/sessions/{sid}/search?q=%ED%A0%80")
    assert found.status_code == 200, found.text


def test_every_router_parses_bodies_with_the_check() -> None:
    """A router made without route_class=JSONRoute would let a lone surrogate through."""
    routers = [
        module.router
        for info in pkgutil.iter_modules(app.api.__path__)
        if isinstance(module := importlib.import_module(f"app.api.{info.name}"), ModuleType)
        and isinstance(getattr(module, "router", None), APIRouter)
    ]
    routes = [r for router in routers for r in router.routes if isinstance(r, APIRoute)]
    assert len(routers) >= 9 and any(r.body_field is not None for r in routes)
    assert [r.path for r in routes if not isinstance(r, JSONRoute)] == []
