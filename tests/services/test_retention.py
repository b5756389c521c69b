"""Retention against a live service: expiry (TTL, tenant default) refuses a session at once, the
purge leaves no row of it in any table of the database, forks keep their shared prefix, old
run events go while the journal stays, and the workers' periodic job purges on its own."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.config import Settings
from app.db.engine import create_engine
from app.main import create_app
from app.services import retention
from app.services.keys import create_key
from app.worker.pool import worker_pool
from testkit.api import append_texts, history, new_session
from testkit.server import serve_in_thread, stop_thread_server
from testkit.sse_client import collect
from testkit.upstream import Fail, FakeUpstream, Text, ToolCall
from testkit.webhook_receiver import WebhookReceiver
from tests.e2e import create_database, e2e_env

PAST = "2000-01-01T00:00:00Z"


@pytest.fixture(scope="module")
def served(database_url: str, upstream: FakeUpstream) -> Iterator[tuple[str, Settings]]:
    """API and workers on a database of their own (the every-table check reads all of it);
    their retention job never runs by itself (the tests call it)."""
    settings = Settings(
        database_url=create_database(database_url, "retention"),
        **e2e_env(upstream),
        retention_cron="0 0 1 1 *",
        run_webhook_backoff_seconds=0,
    )
    server, thread, url = serve_in_thread(create_app(settings, workers=2))
    yield url, settings
    stop_thread_server(server, thread)


@pytest.fixture
async def engine(served: tuple[str, Settings]) -> AsyncIterator[AsyncEngine]:
    engine = create_engine(served[1])
    yield engine
    await engine.dispose()


@pytest.fixture
async def tenant(served: tuple[str, Settings], engine: AsyncEngine) -> str:
    return f"retention-{uuid.uuid4()}"


@pytest.fixture
async def api(
    served: tuple[str, Settings], engine: AsyncEngine, tenant: str, upstream: FakeUpstream
) -> AsyncIterator[httpx.AsyncClient]:
    upstream.clear()
    key = await create_key(engine, tenant)
    async with httpx.AsyncClient(
        base_url=served[0], headers={"Authorization": f"Bearer {key}"}, timeout=60
    ) as client:
        yield client


async def rows_naming(engine: AsyncEngine, ids: list[str]) -> dict[str, int]:
    """Every table of the database (from information_schema, not a list kept by hand) and how
    many of its rows mention any of `ids` anywhere (the whole row as text: every column, json
    and job arguments included)."""
    patterns = [f"%{i}%" for i in ids]
    found: dict[str, int] = {}
    async with engine.connect() as conn:
        tables = (
            await conn.execute(
                text(
                    "SELECT table_schema, table_name FROM information_schema.tables"
                    " WHERE table_type = 'BASE TABLE'"
                    " AND table_schema NOT IN ('pg_catalog', 'information_schema')"
                )
            )
        ).all()
        assert len(tables) >= 10, tables
        for schema, table in tables:
            count = await conn.scalar(
                text(
                    f'SELECT count(*) FROM "{schema}"."{table}" t'
                    " WHERE CAST(t AS text) LIKE ANY(CAST(:patterns AS text[]))"
                ),
                {"patterns": patterns},
            )
            found[f"{schema}.{table}"] = int(count or 0)
    return found


async def jobs_settled(engine: AsyncEngine, ids: list[str]) -> None:
    """Wait until no job naming these ids is queued or running (a job a worker holds when its
    session is purged is left to that worker)."""
    deadline = time.monotonic() + 120
    while True:
        async with engine.connect() as conn:
            busy = await conn.scalar(
                text(
                    "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')"
                    " AND CAST(args AS text) LIKE ANY(CAST(:patterns AS text[]))"
                ),
                {"patterns": [f"%{i}%" for i in ids]},
            )
        if not busy:
            return
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)


async def wait_run(api: httpx.AsyncClient, sid: str, text_in: str) -> dict[str, Any]:
    response = await api.post(f"/v1/sessions/{sid}/ask", json={"input": text_in, "stream": False})
    assert response.status_code == 202, response.text
    run: dict[str, Any] = (
        await api.get(f"/v1/runs/{response.json()['id']}", params={"wait": "true", "timeout": 60})
    ).json()
    assert run["status"] in ("completed", "failed"), run
    return run


async def expire(api: httpx.AsyncClient, sid: str) -> None:
    response = await api.patch(f"/v1/sessions/{sid}", json={"expires_at": PAST})
    assert response.status_code == 200, response.text
    assert response.json()["expires_at"] == "2000-01-01T00:00:00Z"


async def test_a_purged_session_leaves_no_row_in_any_table(
    api: httpx.AsyncClient, engine: AsyncEngine, upstream: FakeUpstream, served: Any
) -> None:
    sid = (await new_session(api, title="to be forgotten"))["id"]
    with WebhookReceiver() as receiver:
        session_hook = (
            await api.post("/v1/webhooks", json={"url": receiver.url, "session_id": sid})
        ).json()
        tenant_hook = (await api.post("/v1/webhooks", json={"url": receiver.url})).json()
        upstream.script(Text("remember me"))
        completed = await wait_run(api, sid, "hello")
        upstream.script(Fail(400, "bad_request", "no"))
        failed = await wait_run(api, sid, "fail please")
        await receiver.wait_for(4)
    deliveries = [
        d["id"]
        for hook in (session_hook, tenant_hook)
        for d in (await api.get(f"/v1/webhooks/{hook['id']}/deliveries")).json()["data"]
    ]
    assert len(deliveries) == 4
    ids = [sid, completed["id"], failed["id"], session_hook["id"], *deliveries]
    await jobs_settled(engine, ids)
    before = {t: n for t, n in (await rows_naming(engine, ids)).items() if n}
    # The check sees them all before: sessions, entries (search rows are in them), runs, run
    # events, webhooks and their log, the runs' and the deliveries' jobs.
    for table in (
        "sessions",
        "entries",
        "runs",
        "run_events",
        "webhook_endpoints",
        "webhook_deliveries",
        "procrastinate_jobs",
    ):
        assert before.get(f"public.{table}"), (table, before)

    await expire(api, sid)
    for method, path in [
        ("GET", f"/v1/sessions/{sid}"),
        ("GET", f"/v1/sessions/{sid}/entries"),
        ("GET", f"/v1/runs/{completed['id']}"),
        ("POST", f"/v1/sessions/{sid}/fork"),
        ("DELETE", f"/v1/sessions/{sid}"),
        ("PATCH", f"/v1/sessions/{sid}"),
    ]:
        kwargs: dict[str, Any] = {"json": {}} if method in ("POST", "PATCH") else {}
        response = await api.request(method, path, **kwargs)
        assert response.status_code == 404, (method, path, response.text)
    for entry in ({"kind": "message", "payload": {"role": "user", "content": "late"}},):
        for with_id in (entry, entry | {"id": "late-1"}):
            late = await api.post(f"/v1/sessions/{sid}/entries", json={"entries": [with_id]})
            assert late.status_code == 404, late.text
            late = await api.post(
                f"/v1/sessions/{sid}/entries", json={"entries": [with_id], "expected_rev": 0}
            )
            assert late.status_code == 404, late.text
    refused = await api.post(f"/v1/sessions/{sid}/ask", json={"input": "still there?"})
    assert refused.status_code == 404
    assert refused.json()["error"]["code"] == "session_not_found"
    assert sid not in [s["id"] for s in (await api.get("/v1/sessions")).json()["data"]]

    await retention.purge_expired_sessions(engine, batch_size=1)
    assert {t: n for t, n in (await rows_naming(engine, ids)).items() if n} == {}
    # The tenant's own webhook stays (its log lost the purged session's deliveries).
    assert [w["id"] for w in (await api.get("/v1/webhooks")).json()["data"]] == [tenant_hook["id"]]


async def test_a_fork_keeps_its_expired_parents_prefix(
    api: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    parent = (await new_session(api))["id"]
    await append_texts(api, parent, "one", "two")
    child = (await api.post(f"/v1/sessions/{parent}/fork", json={})).json()
    await append_texts(api, child["id"], "three")
    grandchild = (await api.post(f"/v1/sessions/{child['id']}/fork", json={})).json()
    expected = [(e["seq"], e["payload"]["content"]) for e in await history(api, child["id"])]
    assert expected == [(1, "one"), (2, "two"), (3, "three")]

    await expire(api, parent)
    assert (await api.get(f"/v1/sessions/{parent}")).status_code == 404
    for sid in (child["id"], grandchild["id"]):  # readable before the purge
        assert [(e["seq"], e["payload"]["content"]) for e in await history(api, sid)] == expected
    await retention.purge_expired_sessions(engine, batch_size=10)
    for sid in (child["id"], grandchild["id"]):  # and after it
        assert [(e["seq"], e["payload"]["content"]) for e in await history(api, sid)] == expected
    assert {t: n for t, n in (await rows_naming(engine, [parent])).items() if n} == {}
    assert (await api.get(f"/v1/sessions/{child['id']}")).json()["parent_id"] is None
    assert await append_texts(api, grandchild["id"], "four") == [4]


async def test_a_parent_and_its_fork_expiring_together_both_go(
    api: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    parent = (await new_session(api))["id"]
    await append_texts(api, parent, "shared")
    child = (await api.post(f"/v1/sessions/{parent}/fork", json={})).json()["id"]
    await append_texts(api, child, "own")
    await expire(api, parent)
    await expire(api, child)
    await retention.purge_expired_sessions(engine, batch_size=1)
    assert {t: n for t, n in (await rows_naming(engine, [parent, child])).items() if n} == {}


async def test_expiry_from_ttl_from_a_date_and_from_the_tenant_default(
    api: httpx.AsyncClient, engine: AsyncEngine, tenant: str
) -> None:
    def lifetime(session: dict[str, Any]) -> timedelta | None:
        if session["expires_at"] is None:
            return None
        expires = datetime.fromisoformat(session["expires_at"])
        return expires - datetime.fromisoformat(session["created_at"])

    assert lifetime(await new_session(api)) is None  # no tenant default: never
    assert lifetime(await new_session(api, ttl_seconds=3600)) == timedelta(hours=1)
    dated = await new_session(api, expires_at="2999-01-02T03:04:05+02:00")
    assert datetime.fromisoformat(dated["expires_at"]) == datetime(2999, 1, 2, 1, 4, 5, tzinfo=UTC)

    await retention.set_session_ttl(engine, tenant, 86400)
    defaulted = await new_session(api)
    assert lifetime(defaulted) == timedelta(days=1)
    assert lifetime(await new_session(api, ttl_seconds=60)) == timedelta(minutes=1)
    fork = (await api.post(f"/v1/sessions/{dated['id']}/fork", json={})).json()
    assert lifetime(fork) == timedelta(days=1)  # a new session: the tenant's default

    patched = await api.patch(f"/v1/sessions/{defaulted['id']}", json={"ttl_seconds": 7200})
    assert patched.status_code == 200
    moved = datetime.fromisoformat(patched.json()["expires_at"])
    assert moved - datetime.fromisoformat(patched.json()["updated_at"]) == timedelta(hours=2)
    cleared = await api.patch(f"/v1/sessions/{defaulted['id']}", json={"expires_at": None})
    assert cleared.json()["expires_at"] is None
    untouched = await api.patch(f"/v1/sessions/{dated['id']}", json={"title": "renamed"})
    assert untouched.json()["expires_at"] == dated["expires_at"]

    await retention.set_session_ttl(engine, tenant, None)
    assert lifetime(await new_session(api)) is None


@pytest.mark.parametrize(
    "body",
    [
        {"ttl_seconds": 0},
        {"ttl_seconds": -5},
        {"ttl_seconds": 10**12},
        {"ttl_seconds": True},
        {"ttl_seconds": "60"},
        {"ttl_seconds": 1.5},
        {"expires_at": "2030-01-01T00:00:00"},  # no time zone
        {"expires_at": "tomorrow"},
        {"expires_at": 1893456000},
        {"ttl_seconds": 60, "expires_at": "2030-01-01T00:00:00Z"},
    ],
)
async def test_bad_expiries_are_refused(api: httpx.AsyncClient, body: dict[str, Any]) -> None:
    created = await api.post("/v1/sessions", json=body)
    assert created.status_code == 422, created.text
    assert created.json()["error"]["code"] == "validation_error"
    sid = (await new_session(api))["id"]
    patched = await api.patch(f"/v1/sessions/{sid}", json=body)
    assert patched.status_code == 422, patched.text
    assert (await api.get(f"/v1/sessions/{sid}")).json()["expires_at"] is None


async def test_old_run_events_go_and_the_journal_stays(
    api: httpx.AsyncClient, engine: AsyncEngine, upstream: FakeUpstream
) -> None:
    sid = (await new_session(api))["id"]
    upstream.script(Text("kept in the journal"))
    run = await wait_run(api, sid, "hello")

    async def events() -> int:
        async with engine.connect() as conn:
            count = await conn.scalar(
                text("SELECT count(*) FROM run_events WHERE run_id = CAST(:id AS uuid)"),
                {"id": run["id"]},
            )
        return int(count or 0)

    async def jobs() -> list[str]:
        """The statuses of the run's procrastinate jobs that have events (all of them)."""
        async with engine.connect() as conn:
            rows = await conn.execute(
                text(
                    "SELECT j.status FROM procrastinate_jobs j WHERE j.args->>'run_id' = :id"
                    " AND EXISTS (SELECT 1 FROM procrastinate_events e WHERE e.job_id = j.id)"
                ),
                {"id": run["id"]},
            )
            return [str(status) for status in rows.scalars()]

    assert await events() > 0
    await jobs_settled(engine, [run["id"]])
    assert await jobs() == ["succeeded"]
    ended = datetime.fromisoformat(run["ended_at"])
    # Within the retention: kept.
    await retention.purge(engine, event_retention_seconds=3600, batch_size=10, now=ended)
    assert await events() > 0 and await jobs() == ["succeeded"]
    later = ended + timedelta(hours=2)
    purged = await retention.purge(engine, event_retention_seconds=3600, batch_size=1, now=later)
    # The finished job goes with the events (its own events with it): they used to pile up.
    assert purged.run_events > 0 and await events() == 0 and await jobs() == []
    assert (await api.get(f"/v1/runs/{run['id']}")).json()["result"] == "kept in the journal"
    answer = [e for e in await history(api, sid) if e["payload"].get("role") == "assistant"]
    assert answer[0]["payload"]["content"] == "kept in the journal"


async def test_finished_maintenance_jobs_do_not_pile_up(engine: AsyncEngine) -> None:
    # A retention pass each minute left a finished job (and its events) each minute, for good.
    async with engine.begin() as conn:
        for status in ("succeeded", "failed", "succeeded", "todo"):
            await conn.execute(
                text(
                    # (the waiting one for tomorrow: the served workers would take it now)
                    "INSERT INTO procrastinate_jobs"
                    " (queue_name, task_name, status, args, scheduled_at)"
                    " VALUES ('maintenance', 'test:finished', CAST(:status AS"
                    " procrastinate_job_status), '{}', now() + interval '1 day')"
                ),
                {"status": status},
            )
    await retention.purge(engine, event_retention_seconds=3600, batch_size=10)
    async with engine.begin() as conn:
        left = await conn.execute(
            text("SELECT status FROM procrastinate_jobs WHERE task_name = 'test:finished'")
        )
        assert [str(status) for status in left.scalars()] == ["todo"]
        await conn.execute(text("DELETE FROM procrastinate_jobs WHERE task_name = 'test:finished'"))


async def test_the_workers_purge_expired_sessions_on_their_own(
    api: httpx.AsyncClient, engine: AsyncEngine, served: tuple[str, Settings]
) -> None:
    """Workers whose periodic job runs every second purge with no one calling anything."""
    sid = (await new_session(api, expires_at=PAST))["id"]
    assert (await api.get(f"/v1/sessions/{sid}")).status_code == 404
    assert any((await rows_naming(engine, [sid])).values())
    every_second = served[1].model_copy(update={"retention_cron": "* * * * * *"})
    async with worker_pool(every_second, 1, engine):
        deadline = time.monotonic() + 120
        while any((await rows_naming(engine, [sid])).values()):
            assert time.monotonic() < deadline, "the retention job never purged the session"
            await asyncio.sleep(0.2)


async def test_a_session_purged_while_its_run_streams(
    api: httpx.AsyncClient, engine: AsyncEngine, upstream: FakeUpstream
) -> None:
    """The purge does not wait for a run: the run's worker finds it gone and stops; the service
    goes on serving other sessions."""
    sid = (await new_session(api))["id"]
    upstream.script(*[Text("z") for _ in range(200)], token_delay=0.02)
    response = await api.post(f"/v1/sessions/{sid}/ask", json={"input": "go", "stream": False})
    run_id = response.json()["id"]
    await collect(api, "GET", f"/v1/runs/{run_id}/events", stop_after=3)
    await expire(api, sid)
    await retention.purge_expired_sessions(engine, batch_size=10)
    await jobs_settled(engine, [run_id])
    # Its job was held by the worker during the purge: the next purge removes it.
    await retention.purge(engine, event_retention_seconds=3600, batch_size=10)
    assert {t: n for t, n in (await rows_naming(engine, [sid, run_id])).items() if n} == {}
    upstream.script(Text("still serving"))
    other = (await new_session(api))["id"]
    assert (await wait_run(api, other, "hello"))["result"] == "still serving"


async def test_ai_sdk_chats_take_the_default_ttl_and_an_expired_one_is_gone(
    api: httpx.AsyncClient, engine: AsyncEngine, tenant: str, upstream: FakeUpstream
) -> None:
    await retention.set_session_ttl(engine, tenant, 3600)
    chat = f"chat-{uuid.uuid4()}"
    body = {
        "id": chat,
        "messages": [{"id": "m1", "role": "user", "parts": [{"type": "text", "text": "hi"}]}],
    }
    upstream.script(Text("hello"))
    async with api.stream("POST", "/v1/ui/chat", json=body) as response:
        assert response.status_code == 200
        await response.aread()
    (session,) = (await api.get("/v1/sessions")).json()["data"]
    expires = datetime.fromisoformat(session["expires_at"])
    assert expires - datetime.fromisoformat(session["created_at"]) == timedelta(hours=1)

    await expire(api, session["id"])
    again = await api.post("/v1/ui/chat", json=body | {"messages": [*body["messages"]]})
    assert again.status_code == 404, again.text  # was a 500: the chat's id was still taken
    assert again.json()["error"]["code"] == "session_not_found"


async def test_a_run_going_when_its_session_expires_finishes(
    api: httpx.AsyncClient, engine: AsyncEngine, upstream: FakeUpstream
) -> None:
    """Expiry refuses the tenant's requests, not the work already under way: a run still going
    takes its next turns (they read the session) and ends as it would have."""
    sid = (await new_session(api, config={"tools": [{"name": "calculator", "kind": "builtin"}]}))[
        "id"
    ]
    upstream.script(
        *[Text(".") for _ in range(100)],
        ToolCall("c1", "calculator", '{"expression": "2+2"}'),
        token_delay=0.02,
    )
    upstream.script(Text("it is 4"))
    response = await api.post(f"/v1/sessions/{sid}/ask", json={"input": "2+2?", "stream": False})
    run_id = response.json()["id"]
    await collect(api, "GET", f"/v1/runs/{run_id}/events", stop_after=3)
    await expire(api, sid)
    deadline = time.monotonic() + 120
    while True:
        async with engine.connect() as conn:
            status, result = (
                await conn.execute(
                    text("SELECT status, result FROM runs WHERE id = CAST(:id AS uuid)"),
                    {"id": run_id},
                )
            ).one()
        if status not in ("queued", "running"):
            break
        assert time.monotonic() < deadline, status
        await asyncio.sleep(0.05)
    assert (status, result) == ("completed", "it is 4")
