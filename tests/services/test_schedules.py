"""Schedules end to end on `threadline serve`: the API (422s, tenants, enable/disable), and
firings with a simulated clock: the schedule's next due time moved into the past (a jump),
ticks given their `now`. Each due time fires once however many ticks run at once."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.services import quotas
from app.services import schedules as schedules_service
from app.services.keys import create_key
from testkit.api import ended_run, history, new_session
from testkit.sse_client import collect
from testkit.upstream import FakeUpstream, Hold, Text
from tests.e2e import Service

MODEL = "openai:gpt-4o-mini"
# Due once a year (1 January): never by itself during a test; its due times are jumped to.
YEARLY = "0 8 1 1 *"


@pytest.fixture
async def tenant(service: Service, e2e_engine: AsyncEngine) -> str:
    return f"schedules-{uuid.uuid4()}"


@pytest.fixture
async def client(
    service: Service, e2e_engine: AsyncEngine, upstream: FakeUpstream, tenant: str
) -> AsyncIterator[httpx.AsyncClient]:
    upstream.clear()
    key = await create_key(e2e_engine, tenant)
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=service.url, headers=headers, timeout=30) as api:
        yield api


async def create(api: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    full = {"name": "nightly", "cron": YEARLY, "ask": {"input": "Summarize."}, **body}
    response = await api.post("/v1/schedules", json=full)
    assert response.status_code == 201, response.text
    return dict(response.json())


async def jump(engine: AsyncEngine, schedule_id: str, due_at: datetime) -> None:
    """The clock jump: the schedule's next due time is now `due_at`, in the past."""
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE schedules SET next_due_at = :due WHERE id = :id"),
            {"due": due_at, "id": schedule_id},
        )


async def runs_of(api: httpx.AsyncClient, schedule_id: str) -> list[dict[str, Any]]:
    response = await api.get(f"/v1/schedules/{schedule_id}/runs")
    assert response.status_code == 200, response.text
    return list(response.json()["data"])


async def tick(service: Service, engine: AsyncEngine, now: datetime, ticks: int = 1) -> None:
    """`ticks` firings of the due schedules at once, as several workers would."""
    await asyncio.gather(
        *(schedules_service.fire_due(engine, service.settings, now) for _ in range(ticks))
    )


async def test_invalid_cron_zone_and_template_are_422_with_the_reason(
    client: httpx.AsyncClient,
) -> None:
    base = {"name": "n", "ask": {"input": "x"}, "agent": "nobody"}
    cases = [
        ({"cron": "61 * * * *"}, "invalid_cron", "61"),
        ({"cron": "* * * *"}, "invalid_cron", "5 fields"),
        ({"cron": "0 8 * * *", "timezone": "Mars/Olympus"}, "invalid_timezone", "Mars/Olympus"),
        ({"cron": "0 8 * * *", "title_template": "T {day}"}, "invalid_title_template", "{day}"),
    ]
    for body, code, reason in cases:
        response = await client.post("/v1/schedules", json={**base, **body})
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert (error["code"], reason in error["message"]) == (code, True), error
    neither = await client.post("/v1/schedules", json={**base, "agent": None, "cron": YEARLY})
    assert neither.status_code == 422
    unknown = await client.post("/v1/schedules", json={**base, "cron": YEARLY})
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "agent_not_found"
    assert (await client.get("/v1/schedules")).json()["data"] == []


async def test_crud_update_disable_and_tenants(
    client: httpx.AsyncClient, api: httpx.AsyncClient
) -> None:
    sid = (await new_session(client, config={"model": MODEL}))["id"]
    made = await create(client, session_id=sid, timezone="Europe/Berlin")
    assert made["next_due_at"].endswith("07:00:00Z")  # 08:00 in Berlin, winter: +01:00
    assert (await client.get(f"/v1/schedules/{made['id']}")).json() == made
    assert [s["id"] for s in (await client.get("/v1/schedules")).json()["data"]] == [made["id"]]

    bad = await client.patch(f"/v1/schedules/{made['id']}", json={"cron": "0 25 * * *"})
    assert bad.status_code == 422
    assert bad.json()["error"]["code"] == "invalid_cron"
    bad_zone = await client.patch(f"/v1/schedules/{made['id']}", json={"timezone": "Nowhere"})
    assert bad_zone.json()["error"]["code"] == "invalid_timezone"

    not_agent = await client.patch(f"/v1/schedules/{made['id']}", json={"agent_version": 2})
    assert not_agent.status_code == 422
    assert not_agent.json()["error"]["code"] == "invalid_schedule"

    changed = await client.patch(
        f"/v1/schedules/{made['id']}", json={"cron": "30 6 1 1 *", "enabled": False}
    )
    assert changed.status_code == 200, changed.text
    assert changed.json()["enabled"] is False
    assert changed.json()["next_due_at"].endswith("05:30:00Z")

    # Another tenant sees none of it.
    assert (await api.get(f"/v1/schedules/{made['id']}")).status_code == 404
    assert (await api.get(f"/v1/schedules/{made['id']}/runs")).status_code == 404
    assert (await api.delete(f"/v1/schedules/{made['id']}")).status_code == 404
    assert (await api.get("/v1/schedules")).json()["data"] == []
    other = await api.post(
        "/v1/schedules",
        json={"name": "x", "cron": YEARLY, "ask": {"input": "x"}, "session_id": sid},
    )
    assert other.status_code == 404  # not its session

    assert (await client.delete(f"/v1/schedules/{made['id']}")).status_code == 204
    assert (await client.get(f"/v1/schedules/{made['id']}")).status_code == 404


async def test_a_due_time_fires_once_however_many_ticks_run_at_once(
    client: httpx.AsyncClient, service: Service, e2e_engine: AsyncEngine, upstream: FakeUpstream
) -> None:
    upstream.script(Text("All quiet."))
    sid = (await new_session(client, config={"model": MODEL}))["id"]
    schedule = await create(client, session_id=sid)
    now = datetime.now(UTC)
    due = now - timedelta(seconds=5)
    await jump(e2e_engine, schedule["id"], due)
    await tick(service, e2e_engine, now, ticks=3)
    await tick(service, e2e_engine, now + timedelta(seconds=1), ticks=3)

    (fired,) = await runs_of(client, schedule["id"])
    assert fired["status"] == "fired"
    assert datetime.fromisoformat(fired["due_at"]) == due
    assert (await ended_run(client, fired["run_id"]))["status"] == "completed"
    assert (await runs_of(client, schedule["id"]))[0]["run_status"] == "completed"
    # Streamed like any run.
    events = await collect(client, "GET", f"/v1/runs/{fired['run_id']}/events")
    assert events[-1].type == "run.completed"
    assert "All quiet." in "".join(e.data.get("text", "") for e in events)
    # An ordinary ask in the session: the user's words, then the answer.
    contents = [e["payload"].get("content") for e in await history(client, sid)]
    assert contents.count("Summarize.") == 1
    assert "All quiet." in str(contents)
    again = (await client.get(f"/v1/schedules/{schedule['id']}")).json()
    assert datetime.fromisoformat(again["next_due_at"]) > now
    assert again["updated_at"] == schedule["updated_at"]  # a firing is no change of it


@pytest.mark.parametrize(("misfire", "fired"), [("run_once", 1), ("skip", 0)])
async def test_a_jump_over_several_due_times_fires_once_or_none(
    client: httpx.AsyncClient,
    service: Service,
    e2e_engine: AsyncEngine,
    upstream: FakeUpstream,
    misfire: str,
    fired: int,
) -> None:
    upstream.script(Text("Caught up."))
    sid = (await new_session(client, config={"model": MODEL}))["id"]
    schedule = await create(client, session_id=sid, cron="0 8 * * *", misfire=misfire)
    now = datetime.now(UTC)
    await jump(e2e_engine, schedule["id"], now - timedelta(days=3))  # 3 or 4 due times missed
    await tick(service, e2e_engine, now, ticks=3)

    (only,) = await runs_of(client, schedule["id"])
    assert only["status"] == ("fired" if fired else "skipped")
    if fired:
        assert (await ended_run(client, only["run_id"]))["status"] == "completed"
    else:
        assert (only["reason"], only["run_id"]) == ("misfired", None)
    user_words = [e for e in await history(client, sid) if e["payload"].get("role") == "user"]
    assert len(user_words) == fired


async def test_a_tenant_over_quota_gets_a_failed_firing_and_no_retry(
    client: httpx.AsyncClient, service: Service, e2e_engine: AsyncEngine, tenant: str
) -> None:
    sid = (await new_session(client, config={"model": MODEL}))["id"]
    schedule = await create(client, session_id=sid)
    await quotas.set_limits(e2e_engine, service.settings, tenant, {"concurrent_runs": 0})
    now = datetime.now(UTC)
    await jump(e2e_engine, schedule["id"], now - timedelta(seconds=1))
    for later in range(5):  # tick after tick: the refused due time is not asked again
        await tick(service, e2e_engine, now + timedelta(seconds=later), ticks=2)

    (failed,) = await runs_of(client, schedule["id"])
    assert (failed["status"], failed["reason"], failed["run_id"]) == (
        "failed",
        "concurrent_runs_limit",
        None,
    )
    assert "limit" in failed["message"]
    assert await history(client, sid) == []  # nothing written to the session


async def test_a_busy_session_skips_or_queues_as_the_schedule_says(
    client: httpx.AsyncClient, service: Service, e2e_engine: AsyncEngine, upstream: FakeUpstream
) -> None:
    release = threading.Event()
    upstream.script(Hold(release), Text("first"))
    upstream.script(Text("queued answer"))
    sid = (await new_session(client, config={"model": MODEL}))["id"]
    skipping = await create(client, session_id=sid, busy="skip")
    queueing = await create(client, session_id=sid, busy="queue", name="queueing")
    started = await client.post(f"/v1/sessions/{sid}/ask", json={"input": "one", "stream": False})
    await upstream.requests_arrived(1)
    now = datetime.now(UTC)
    for schedule in (skipping, queueing):
        await jump(e2e_engine, schedule["id"], now - timedelta(seconds=1))
    await tick(service, e2e_engine, now)
    release.set()

    (skipped,) = await runs_of(client, skipping["id"])
    assert (skipped["status"], skipped["reason"]) == ("skipped", "session_busy")
    (queued,) = await runs_of(client, queueing["id"])
    assert queued["status"] == "fired"
    assert (await ended_run(client, started.json()["id"]))["status"] == "completed"
    assert (await ended_run(client, queued["run_id"]))["status"] == "completed"


async def test_an_agent_schedule_makes_a_titled_session_each_time(
    client: httpx.AsyncClient, service: Service, e2e_engine: AsyncEngine, upstream: FakeUpstream
) -> None:
    agent = {"name": "triage", "config": {"model": MODEL, "system_prompt": "You triage."}}
    assert (await client.post("/v1/agents", json=agent)).status_code == 201
    schedule = await create(
        client, agent="triage", title_template="Tickets {date}", timezone="Europe/Berlin"
    )
    titles = []
    for day in (2, 1):
        upstream.script(Text(f"Day {day}."))
        due = datetime(2026, 3, 29, 1, 0, tzinfo=UTC) - timedelta(days=day)
        await jump(e2e_engine, schedule["id"], due)
        await tick(service, e2e_engine, due + timedelta(seconds=2))
        fired = (await runs_of(client, schedule["id"]))[0]
        assert fired["status"] == "fired", fired
        assert (await ended_run(client, fired["run_id"]))["status"] == "completed"
        session = (await client.get(f"/v1/sessions/{fired['session_id']}")).json()
        assert (session["agent"]["name"], session["agent"]["version"]) == ("triage", 1)
        titles.append(session["title"])
        assert upstream.requests[-1].body["messages"][0]["content"] == "You triage."
    assert titles == ["Tickets 2026-03-27", "Tickets 2026-03-28"]
    assert len(await runs_of(client, schedule["id"])) == 2


async def test_a_disabled_schedule_does_not_fire_and_a_deleted_session_fails_the_firing(
    client: httpx.AsyncClient, service: Service, e2e_engine: AsyncEngine
) -> None:
    sid = (await new_session(client, config={"model": MODEL}))["id"]
    off = await create(client, session_id=sid, enabled=False)
    gone = await create(client, session_id=sid, name="orphan")
    assert (await client.delete(f"/v1/sessions/{sid}")).status_code == 204
    now = datetime.now(UTC)
    for schedule in (off, gone):
        await jump(e2e_engine, schedule["id"], now - timedelta(seconds=1))
    await tick(service, e2e_engine, now)

    assert await runs_of(client, off["id"]) == []
    (failed,) = await runs_of(client, gone["id"])
    assert (failed["status"], failed["reason"]) == ("failed", "session_not_found")
    # Enabled again: from its next due time on, not the one passed while it was off.
    enabled = (await client.patch(f"/v1/schedules/{off['id']}", json={"enabled": True})).json()
    assert datetime.fromisoformat(enabled["next_due_at"]) > now
