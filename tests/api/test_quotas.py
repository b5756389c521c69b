"""Tenant quotas against a served API with workers: over a limit, 429 with Retry-After and a
clear code, and nothing journaled for the refused requests, under concurrent requests."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.config import Settings
from app.services import quotas
from app.services.keys import create_key
from testkit.api import ended_run, history, new_session
from testkit.upstream import FakeUpstream, Hold, Text, Usage
from tests.e2e import Service, heard


@dataclass
class Tenant:
    name: str
    api: httpx.AsyncClient
    limit: Callable[..., Awaitable[quotas.TenantLimits]]


@pytest.fixture
async def tenant(
    service: Service, e2e_engine: AsyncEngine, e2e_settings: Settings, upstream: FakeUpstream
) -> AsyncIterator[Tenant]:
    upstream.clear()
    name = f"quota-{uuid.uuid4()}"
    key = await create_key(e2e_engine, name)

    async def limit(**values: int | None) -> quotas.TenantLimits:
        limits = await quotas.set_limits(e2e_engine, e2e_settings, name, values)
        await heard(service, key)
        return limits

    async with httpx.AsyncClient(
        base_url=service.url, headers={"Authorization": f"Bearer {key}"}, timeout=60
    ) as client:
        yield Tenant(name, client, limit)


def refused(response: httpx.Response, code: str) -> dict[str, Any]:
    assert response.status_code == 429, response.text
    assert int(response.headers["retry-after"]) >= 1
    error: dict[str, Any] = response.json()["error"]
    assert error["code"] == code, error
    return error


async def ask(api: httpx.AsyncClient, session_id: str, text: str = "hi") -> httpx.Response:
    return await api.post(f"/v1/sessions/{session_id}/ask", json={"input": text, "stream": False})


async def ended(api: httpx.AsyncClient, run_id: str) -> dict[str, Any]:
    run = await ended_run(api, run_id)
    assert run["status"] == "completed", run
    return run


async def test_concurrent_asks_at_a_run_limit_of_two(
    tenant: Tenant, upstream: FakeUpstream
) -> None:
    """10 asks at once on 10 sessions with 2 runs allowed: exactly 2 are accepted, 8 refused
    with 429 concurrent_runs_limit, and the refused sessions' journals stay empty."""
    sessions = [(await new_session(tenant.api))["id"] for _ in range(10)]
    release = threading.Event()
    for _ in range(2):
        upstream.script(Hold(release), Text("done"), Usage(10, 2))
    await tenant.limit(concurrent_runs=2)
    try:
        responses = await asyncio.gather(*(ask(tenant.api, sid) for sid in sessions))
        statuses = sorted(r.status_code for r in responses)
        assert statuses == [202] * 2 + [429] * 8, [r.text for r in responses]
        for response in responses:
            if response.status_code == 429:
                error = refused(response, "concurrent_runs_limit")
                assert error["details"]["limit"] == 2 and error["details"]["current"] == 2
        for sid, response in zip(sessions, responses, strict=True):
            entries = await history(tenant.api, sid)
            if response.status_code == 202:
                assert [e["kind"] for e in entries] == ["message", "run_start"]
            else:
                assert entries == []
                session = (await tenant.api.get(f"/v1/sessions/{sid}")).json()
                assert session["rev"] == 0
    finally:
        release.set()
    for response in responses:
        if response.status_code == 202:
            await ended(tenant.api, response.json()["id"])
    # Both runs over: asks are accepted again.
    upstream.script(Text("again"))
    again = await ask(tenant.api, sessions[-1])
    assert again.status_code == 202, again.text
    await ended(tenant.api, again.json()["id"])


async def test_requests_per_minute_under_concurrent_requests(
    tenant: Tenant, e2e_engine: AsyncEngine
) -> None:
    """Exactly `rpm` of a burst pass (tried again in the rare case the burst straddles a
    minute, where each window passes at most `rpm`)."""
    await tenant.limit(requests_per_minute=5)
    minute = text("SELECT date_trunc('minute', now())")
    for _ in range(5):
        async with e2e_engine.connect() as conn:
            before = await conn.scalar(minute)
        responses = await asyncio.gather(*(tenant.api.get("/v1/sessions") for _ in range(12)))
        async with e2e_engine.connect() as conn:
            after = await conn.scalar(minute)
        passed = [r for r in responses if r.status_code == 200]
        if before != after:
            assert len(passed) <= 10
            continue
        assert len(passed) == 5, [r.status_code for r in responses]
        for response in responses:
            if response.status_code != 200:
                error = refused(response, "rate_limited")
                assert error["details"]["limit"] == 5
                assert 1 <= int(response.headers["retry-after"]) <= 60
                reset = datetime.fromisoformat(error["details"]["reset"])
                assert reset.second == 0 and reset.microsecond == 0
        return
    pytest.fail("every burst straddled a minute")


async def test_a_token_quota_refuses_the_next_ask(tenant: Tenant, upstream: FakeUpstream) -> None:
    await tenant.limit(input_tokens_per_day=100)
    sid = (await new_session(tenant.api))["id"]
    upstream.script(Text("long"), Usage(150, 5))
    first = await ask(tenant.api, sid)
    assert first.status_code == 202
    await ended(tenant.api, first.json()["id"])  # a run in flight may overshoot the quota
    rev = (await tenant.api.get(f"/v1/sessions/{sid}")).json()["rev"]
    second = await ask(tenant.api, sid)
    error = refused(second, "token_quota_exceeded")
    assert error["details"]["current"] == 150 and error["details"]["limit"] == 100
    assert error["details"]["limit_name"] == "input_tokens_per_day"
    reset = datetime.fromisoformat(error["details"]["reset"])
    assert reset > datetime.now(UTC) and (reset.hour, reset.minute) == (0, 0)
    assert int(second.headers["retry-after"]) <= 86401
    assert (await tenant.api.get(f"/v1/sessions/{sid}")).json()["rev"] == rev
    # Raising the limit lets asks through again.
    await tenant.limit(input_tokens_per_day=1000)
    upstream.script(Text("ok"))
    third = await ask(tenant.api, sid)
    assert third.status_code == 202


async def test_session_limit_under_concurrent_creates_and_forks(tenant: Tenant) -> None:
    await tenant.limit(max_sessions=3)
    responses = await asyncio.gather(
        *(tenant.api.post("/v1/sessions", json={"title": f"s{i}"}) for i in range(8))
    )
    assert sorted(r.status_code for r in responses) == [201] * 3 + [429] * 5
    for response in responses:
        if response.status_code == 429:
            error = refused(response, "session_limit")
            assert error["details"]["limit"] == 3 and error["details"]["current"] == 3
    created = [r.json()["id"] for r in responses if r.status_code == 201]
    refused(await tenant.api.post(f"/v1/sessions/{created[0]}/fork", json={}), "session_limit")
    chat = {"id": f"chat-{uuid.uuid4()}", "messages": [_user("hi")], "trigger": "submit-message"}
    refused(await tenant.api.post("/v1/ui/chat", json=chat), "session_limit")
    listed = (await tenant.api.get("/v1/sessions")).json()["data"]
    assert sorted(s["id"] for s in listed) == sorted(created)
    assert (await tenant.api.delete(f"/v1/sessions/{created[0]}")).status_code == 204
    assert (await tenant.api.post("/v1/sessions", json={})).status_code == 201


def _user(text: str) -> dict[str, Any]:
    return {"id": str(uuid.uuid4()), "role": "user", "parts": [{"type": "text", "text": text}]}


async def test_the_ai_sdk_chat_passes_the_same_checks(
    tenant: Tenant, upstream: FakeUpstream
) -> None:
    """A refused chat message leaves nothing behind: no session for a new chat, no rollback
    for a regenerate."""
    chat_id = f"chat-{uuid.uuid4()}"
    body = {"id": chat_id, "messages": [_user("Hi")], "trigger": "submit-message"}
    upstream.script(Text("Hello"))
    async with tenant.api.stream("POST", "/v1/ui/chat", json=body) as response:
        assert response.status_code == 200
        [line async for line in response.aiter_lines()]
    (session,) = (await tenant.api.get("/v1/sessions")).json()["data"]
    before = await history(tenant.api, session["id"])
    await tenant.limit(concurrent_runs=0)
    regenerate = {"id": chat_id, "messages": [_user("Hi")], "trigger": "regenerate-message"}
    refused(await tenant.api.post("/v1/ui/chat", json=regenerate), "concurrent_runs_limit")
    assert await history(tenant.api, session["id"]) == before
    other = {"id": f"chat-{uuid.uuid4()}", "messages": [_user("Hi")], "trigger": "submit-message"}
    refused(await tenant.api.post("/v1/ui/chat", json=other), "concurrent_runs_limit")
    assert len((await tenant.api.get("/v1/sessions")).json()["data"]) == 1


async def test_usage_report_is_what_the_upstream_reported(
    tenant: Tenant, upstream: FakeUpstream
) -> None:
    sid = (await new_session(tenant.api, config={"model": "openai:gpt-4o-mini"}))["id"]
    runs = []
    for text_, usage in (("a", Usage(12, 3, cached=4)), ("b", Usage(20, 5))):
        upstream.script(Text(text_), usage)
        response = await ask(tenant.api, sid, text_)
        assert response.status_code == 202
        runs.append(await ended(tenant.api, response.json()["id"]))
    report = (await tenant.api.get("/v1/usage")).json()
    today = datetime.now(UTC).date().isoformat()
    (row,) = report["data"]
    assert row["day"] == today and row["tenant"] == tenant.name
    assert row["model"] == "openai:gpt-4o-mini"
    assert (row["runs"], row["input_tokens"], row["output_tokens"], row["cached_tokens"]) == (
        2,
        32,
        8,
        4,
    )
    assert row["cost_usd"] == pytest.approx(sum(r["usage"]["cost_usd"] for r in runs))
    assert row["cost_usd"] > 0 and row["unpriced_runs"] == 0
    assert report["totals"]["input_tokens"] == 32 and report["to"] == today
    # Deleting the session does not take back what was used.
    assert (await tenant.api.delete(f"/v1/sessions/{sid}")).status_code == 204
    assert (await tenant.api.get("/v1/usage")).json() == report
    assert (
        await tenant.api.get("/v1/usage", params={"from": "2020-01-01", "to": "2020-01-31"})
    ).json()["data"] == []
    bad = await tenant.api.get("/v1/usage", params={"from": "2026-02-30"})
    assert bad.status_code == 422 and bad.json()["error"]["code"] == "invalid_date"
    long = await tenant.api.get("/v1/usage", params={"from": "2020-01-01", "to": "2026-01-01"})
    assert long.status_code == 422 and long.json()["error"]["code"] == "range_too_long"


async def test_an_interrupting_ask_takes_the_place_of_the_run_it_stops(
    tenant: Tenant, upstream: FakeUpstream
) -> None:
    """At a limit of one run, an ask that interrupts the session's run is accepted (that run is
    ending); an ask on another session is not."""
    sid, other = (await new_session(tenant.api))["id"], (await new_session(tenant.api))["id"]
    await tenant.limit(concurrent_runs=1)
    release = threading.Event()
    upstream.script(Hold(release), Text("first"))
    try:
        first = await ask(tenant.api, sid)
        assert first.status_code == 202
        refused(await ask(tenant.api, other), "concurrent_runs_limit")
        upstream.script(Text("second"))
        second = await tenant.api.post(
            f"/v1/sessions/{sid}/ask",
            json={"input": "instead", "stream": False, "multitask_strategy": "interrupt"},
        )
        assert second.status_code == 202, second.text
    finally:
        release.set()
    await ended(tenant.api, second.json()["id"])
    stopped = await tenant.api.get(f"/v1/runs/{first.json()['id']}", params={"wait": "true"})
    assert stopped.json()["status"] == "cancelled"


async def test_a_refused_rollback_ask_leaves_the_running_run_alone(
    tenant: Tenant, upstream: FakeUpstream
) -> None:
    """A rollback ask stops the session's run before committing: over a quota it is refused
    before that, and the run goes on."""
    spent, busy = (await new_session(tenant.api))["id"], (await new_session(tenant.api))["id"]
    upstream.script(Text("long"), Usage(150, 5))
    first = await ask(tenant.api, spent)
    await ended(tenant.api, first.json()["id"])
    release = threading.Event()
    upstream.script(Hold(release), Text("kept"))
    try:
        running = await ask(tenant.api, busy)
        assert running.status_code == 202
        before = await history(tenant.api, busy)
        await tenant.limit(input_tokens_per_day=100)
        rollback = await tenant.api.post(
            f"/v1/sessions/{busy}/ask",
            json={"input": "redo", "stream": False, "multitask_strategy": "rollback"},
        )
        refused(rollback, "token_quota_exceeded")
        run = (await tenant.api.get(f"/v1/runs/{running.json()['id']}")).json()
        assert run["status"] in ("queued", "running") and run.get("cancel_mode") is None
        assert await history(tenant.api, busy) == before
    finally:
        release.set()
    assert (await ended(tenant.api, running.json()["id"]))["result"] == "kept"


async def test_an_output_token_quota(tenant: Tenant, upstream: FakeUpstream) -> None:
    await tenant.limit(output_tokens_per_day=4)
    sid = (await new_session(tenant.api))["id"]
    upstream.script(Text("many words"), Usage(1, 5))
    first = await ask(tenant.api, sid)
    await ended(tenant.api, first.json()["id"])
    error = refused(await ask(tenant.api, sid), "token_quota_exceeded")
    assert error["details"]["limit_name"] == "output_tokens_per_day"
    assert (error["details"]["limit"], error["details"]["current"]) == (4, 5)
