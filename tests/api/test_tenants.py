"""Tenant isolation (DESIGN invariant 9): another tenant's ids answer 404, lists never leak."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from fastapi import FastAPI

from testkit.api import append_texts, history, message, new_session
from tests.conftest import ClientFactory

# Every route that names a session, with a body that would succeed for its owner.
SESSION_ROUTES: dict[tuple[str, str], dict[str, Any] | None] = {
    ("GET", "/v1/sessions/{session_id}"): None,
    ("PATCH", "/v1/sessions/{session_id}"): {"title": "stolen"},
    ("DELETE", "/v1/sessions/{session_id}"): None,
    ("POST", "/v1/sessions/{session_id}/fork"): {},
    ("GET", "/v1/sessions/{session_id}/entries"): None,
    ("POST", "/v1/sessions/{session_id}/entries"): {"entries": [message("injected")]},
    ("POST", "/v1/sessions/{session_id}/projection"): {},
    ("GET", "/v1/sessions/{session_id}/context"): None,
    ("POST", "/v1/sessions/{session_id}/ask"): {"input": "hi", "stream": False},
    ("GET", "/v1/sessions/{session_id}/stream"): None,
    ("GET", "/v1/sessions/{session_id}/search?q=secret"): None,
    ("POST", "/v1/sessions/{session_id}/compact"): {"keep_last_turns": 0},
    ("GET", "/v1/sessions/{session_id}/export"): None,
    ("POST", "/v1/sessions/{session_id}/agent_version"): {},
}
RUN_ROUTES: dict[tuple[str, str], dict[str, Any] | None] = {
    ("GET", "/v1/runs/{run_id}"): None,
    ("GET", "/v1/runs/{run_id}/events"): None,
    ("POST", "/v1/runs/{run_id}/cancel"): None,
    ("POST", "/v1/runs/{run_id}/tool_outputs"): {
        "tool_outputs": [{"tool_call_id": "c1", "output": "x"}]
    },
    ("GET", "/v1/runs/{run_id}/approvals"): None,
    ("POST", "/v1/runs/{run_id}/approvals"): {
        "approvals": [{"tool_call_id": "c1", "decision": "approve"}]
    },
}


def test_every_session_route_is_covered(app: FastAPI) -> None:
    routes = {
        (method.upper(), path)
        for path, operations in app.openapi()["paths"].items()
        if "{session_id}" in path
        for method in operations
    }
    covered = {(method, path.split("?")[0]) for method, path in SESSION_ROUTES}
    assert routes == covered, "add new session routes to SESSION_ROUTES"
    run_routes = {
        (method.upper(), path)
        for path, operations in app.openapi()["paths"].items()
        if "{run_id}" in path
        for method in operations
    }
    assert run_routes == set(RUN_ROUTES), "add new run routes to RUN_ROUTES"


async def test_another_tenants_run_is_404_everywhere(
    make_client: ClientFactory, new_key: Callable[[], Awaitable[str]]
) -> None:
    owner, intruder = make_client(await new_key()), make_client(await new_key())
    session = await new_session(owner)
    run = await owner.post(
        f"/v1/sessions/{session['id']}/ask", json={"input": "q", "stream": False}
    )
    assert run.status_code == 202
    for (method, path), body in RUN_ROUTES.items():
        response = await intruder.request(method, path.format(run_id=run.json()["id"]), json=body)
        assert response.status_code == 404, (method, path, response.text)
        assert response.json()["error"]["code"] == "run_not_found"
    assert (await owner.get(f"/v1/runs/{run.json()['id']}")).json()["status"] == "queued"


async def test_another_tenants_session_is_404_everywhere(
    make_client: ClientFactory, new_key: Callable[[], Awaitable[str]]
) -> None:
    owner, intruder = make_client(await new_key()), make_client(await new_key())
    session = await new_session(owner, title="private", metadata={"team": "x"})
    await append_texts(owner, session["id"], "secret")
    for (method, path), body in SESSION_ROUTES.items():
        response = await intruder.request(method, path.format(session_id=session["id"]), json=body)
        assert response.status_code == 404, (method, path, response.text)
        assert response.json()["error"]["code"] == "session_not_found"
    # Nothing the intruder tried changed anything.
    after = (await owner.get(f"/v1/sessions/{session['id']}")).json()
    assert (after["title"], after["rev"]) == ("private", 1)
    assert [e["payload"]["content"] for e in await history(owner, session["id"])] == ["secret"]


async def test_lists_never_leak(
    make_client: ClientFactory, new_key: Callable[[], Awaitable[str]]
) -> None:
    a, b = make_client(await new_key()), make_client(await new_key())
    mine = {(await new_session(a, metadata={"shared": "tag"}))["id"] for _ in range(3)}
    theirs = {(await new_session(b, metadata={"shared": "tag"}))["id"] for _ in range(2)}
    listed_a = {
        s["id"] for s in (await a.get("/v1/sessions", params={"limit": 100})).json()["data"]
    }
    filtered_b = (await b.get("/v1/sessions", params={"metadata": "shared:tag"})).json()["data"]
    assert listed_a == mine
    assert {s["id"] for s in filtered_b} == theirs


async def test_requests_without_a_valid_key_are_401(
    make_client: ClientFactory, client: httpx.AsyncClient
) -> None:
    session = await new_session(client)
    for headers in ({}, {"Authorization": "Bearer tl_nope"}, {"Authorization": "Basic abc"}):
        anonymous = make_client(None)
        response = await anonymous.get(f"/v1/sessions/{session['id']}", headers=headers)
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "unauthorized"
        assert response.headers["www-authenticate"] == "Bearer"


async def test_keys_are_stored_hashed(client: httpx.AsyncClient, engine: Any) -> None:
    from sqlalchemy import text

    key = client.headers["authorization"].removeprefix("Bearer ")
    async with engine.connect() as conn:
        stored = list(await conn.scalars(text("SELECT key_hash FROM api_keys")))
    assert key not in stored
    assert all(len(h) == 64 for h in stored)
