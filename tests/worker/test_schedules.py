"""Schedules fired by three `threadline worker` processes ticking at once: each due time fires
exactly once (the firing is claimed in Postgres, not by timing); after a clock jump over several
due times, misfire run_once fires once and skip fires none. The clock is simulated by moving a
schedule's next due time into the past."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.config import Settings
from app.db.engine import create_engine
from testkit.api import ended_run, history, new_session
from testkit.upstream import FakeUpstream, Text
from tests.worker.conftest import Workers

YEARLY = "0 8 1 1 *"  # never due by itself during the test
TICKS = {"schedule_tick_seconds": 0.2}


@pytest.fixture
async def crash_engine(crash_settings: Settings) -> AsyncIterator[AsyncEngine]:
    engine = create_engine(crash_settings)
    yield engine
    await engine.dispose()


async def create(api: httpx.AsyncClient, sid: str, **body: Any) -> str:
    full = {"name": "s", "cron": YEARLY, "ask": {"input": "Report."}, "session_id": sid, **body}
    response = await api.post("/v1/schedules", json=full)
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


async def jump(engine: AsyncEngine, schedule_id: str, due_at: datetime) -> None:
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE schedules SET next_due_at = :due WHERE id = :id"),
            {"due": due_at, "id": schedule_id},
        )


async def firings(api: httpx.AsyncClient, schedule_id: str, count: int) -> list[dict[str, Any]]:
    """The schedule's firings once there are `count` (the workers tick on their own time)."""
    deadline = time.monotonic() + 120
    while True:
        found = list((await api.get(f"/v1/schedules/{schedule_id}/runs")).json()["data"])
        if len(found) >= count:
            return found
        assert time.monotonic() < deadline, f"{len(found)} firings, expected {count}"
        await asyncio.sleep(0.2)


@pytest.mark.slow
@pytest.mark.parametrize("worker_settings", [TICKS])
async def test_three_workers_fire_each_due_time_exactly_once(
    api_only: httpx.AsyncClient, upstream: FakeUpstream, workers: Workers, crash_engine: AsyncEngine
) -> None:
    workers.start()
    workers.start()
    assert len(workers.processes) == 3
    sid = (await new_session(api_only))["id"]
    schedule = await create(api_only, sid)
    rounds = 4
    dues = []
    for k in range(rounds):
        upstream.script(Text(f"report {k}"))
        due = datetime.now(UTC) - timedelta(seconds=1)
        dues.append(due)
        await jump(crash_engine, schedule, due)
        await firings(api_only, schedule, k + 1)
    found = await firings(api_only, schedule, rounds)
    assert Counter(f["due_at"] for f in found).most_common(1)[0][1] == 1
    assert sorted(datetime.fromisoformat(f["due_at"]) for f in found) == dues
    assert {f["status"] for f in found} == {"fired"}
    for f in found:
        assert (await ended_run(api_only, f["run_id"]))["status"] == "completed"
    asked = [e for e in await history(api_only, sid) if e["payload"].get("role") == "user"]
    assert len(asked) == rounds


@pytest.mark.slow
@pytest.mark.parametrize("worker_settings", [TICKS])
async def test_after_a_jump_run_once_fires_once_and_skip_none(
    api_only: httpx.AsyncClient, upstream: FakeUpstream, workers: Workers, crash_engine: AsyncEngine
) -> None:
    workers.start()
    workers.start()
    upstream.script(Text("caught up"))
    once_sid = (await new_session(api_only))["id"]
    skip_sid = (await new_session(api_only))["id"]
    once = await create(api_only, once_sid, cron="0 8 * * *", misfire="run_once")
    skip = await create(api_only, skip_sid, cron="0 8 * * *", misfire="skip")
    three_days_ago = datetime.now(UTC) - timedelta(days=3)
    for schedule in (once, skip):
        await jump(crash_engine, schedule, three_days_ago)

    (fired,) = await firings(api_only, once, 1)
    (skipped,) = await firings(api_only, skip, 1)
    assert fired["status"] == "fired"
    assert (await ended_run(api_only, fired["run_id"]))["status"] == "completed"
    assert (skipped["status"], skipped["reason"], skipped["run_id"]) == (
        "skipped",
        "misfired",
        None,
    )
    # The schedules wait for their next due time, tomorrow at the latest: nothing more fires.
    for schedule in (once, skip):
        got = (await api_only.get(f"/v1/schedules/{schedule}")).json()
        assert datetime.fromisoformat(got["next_due_at"]) > datetime.now(UTC)
    assert len(await firings(api_only, once, 1)) == 1
    assert len(await firings(api_only, skip, 1)) == 1
    assert [e for e in await history(api_only, skip_sid)] == []
    once_asked = [
        e for e in await history(api_only, once_sid) if e["payload"].get("role") == "user"
    ]
    assert len(once_asked) == 1
