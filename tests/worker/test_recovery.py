"""Runs always end: a dead worker's run is taken over through its lease (not its heartbeat), a
cancel ends a run whose worker is gone, a run that takes its workers down fails, and a paused
worker keeps its run and goes on taking jobs."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest
from procrastinate.jobs import Status
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.config import Settings
from app.core.runs import RunStatus
from app.db import runs as runs_db
from app.db.engine import create_engine, libpq_url
from app.db.jobs import RUN_QUEUE
from app.eventlog.writer import EventWriter
from app.llm.router import Router
from app.services import asks, runs
from app.services.keys import tenant_for_key
from app.services.sessions import create_session
from app.worker.lease import WorkerLease
from app.worker.pool import queue_app, recover_orphaned_runs
from app.worker.run import execute_run, start_locked
from app.worker.runtime import Runtime
from testkit.api import ended_run, new_session
from testkit.locks import holding_session, never_waiting_for
from testkit.sse_client import TERMINAL, collect
from testkit.upstream import FakeUpstream, Hold, Text
from tests.conftest import issue_key
from tests.e2e import create_database, e2e_env
from tests.worker.conftest import Workers

# Heartbeats would take over after an hour: only a lease can explain a takeover within a test.
NO_HEARTBEAT_TAKEOVER = {"stalled_after_seconds": 3600}


async def ask(api: httpx.AsyncClient, sid: str, text: str = "q") -> dict[str, Any]:
    response = await api.post(f"/v1/sessions/{sid}/ask", json={"input": text, "stream": False})
    assert response.status_code == 202, response.text
    run: dict[str, Any] = response.json()
    return run


async def until_streaming(api: httpx.AsyncClient, run_id: str, attempt: int) -> None:
    """Until the run's attempt `attempt` has sent a delta (a generous bound: a run nobody
    takes over would keep the stream open, heartbeat after heartbeat)."""
    async with asyncio.timeout(120):
        events = await collect(api, "GET", f"/v1/runs/{run_id}/events", until="message.delta")
        while [e for e in events if e.type == "run.started"][-1].data["attempt"] != attempt:
            after = events[-1].id
            events += await collect(
                api,
                "GET",
                f"/v1/runs/{run_id}/events",
                until="message.delta",
                headers={"Last-Event-ID": str(after)},
            )


async def assert_one_terminal_and_dense(api: httpx.AsyncClient, run_id: str) -> list[Any]:
    events = await collect(api, "GET", f"/v1/runs/{run_id}/events")
    assert [e.id for e in events] == list(range(1, len(events) + 1))
    terminal = [e for e in events if e.type in TERMINAL]
    assert len(terminal) == 1 and terminal[0] is events[-1]
    return events


@pytest.mark.slow
@pytest.mark.parametrize("worker_settings", [NO_HEARTBEAT_TAKEOVER])
async def test_a_killed_workers_run_is_taken_over_through_its_lease(
    api_only: httpx.AsyncClient, upstream: FakeUpstream, workers: Workers
) -> None:
    sid = (await new_session(api_only))["id"]
    upstream.script(*[Text(f"a{i} ") for i in range(400)], token_delay=0.03)  # killed midway
    upstream.script(Text("taken over"))
    run = await ask(api_only, sid)
    await until_streaming(api_only, run["id"], 1)
    workers.kill_and_replace()
    done = await ended_run(api_only, run["id"])
    assert (done["status"], done["result"], done["attempts"]) == ("completed", "taken over", 2)
    events = await assert_one_terminal_and_dense(api_only, run["id"])
    assert [e.data["reason"] for e in events if e.type == "message.reset"] == ["retry"]


@pytest.mark.slow
@pytest.mark.parametrize("worker_settings", [NO_HEARTBEAT_TAKEOVER])
async def test_a_cancel_after_the_worker_died_ends_the_run_at_once(
    api_only: httpx.AsyncClient, upstream: FakeUpstream, workers: Workers
) -> None:
    sid = (await new_session(api_only))["id"]
    upstream.script(*[Text(f"a{i} ") for i in range(400)], token_delay=0.03)
    run = await ask(api_only, sid)
    await until_streaming(api_only, run["id"], 1)
    workers.processes[-1].kill()  # and no other worker
    cancelled = (await api_only.post(f"/v1/runs/{run['id']}/cancel")).json()
    assert cancelled["status"] == "cancelled"
    events = await assert_one_terminal_and_dense(api_only, run["id"])
    assert events[-1].type == "run.cancelled"
    # The dead worker's job no longer holds the session: the next ask runs on a new worker.
    workers.start()
    upstream.script(Text("next"))
    nxt = await ended_run(api_only, (await ask(api_only, sid))["id"])
    assert (nxt["status"], nxt["result"]) == ("completed", "next")


@pytest.mark.slow
@pytest.mark.parametrize("worker_settings", [NO_HEARTBEAT_TAKEOVER])
async def test_a_run_whose_workers_die_twice_fails_instead_of_being_passed_on(
    api_only: httpx.AsyncClient, upstream: FakeUpstream, workers: Workers
) -> None:
    sid = (await new_session(api_only))["id"]
    for _ in range(3):
        upstream.script(*[Text(f"a{i} ") for i in range(400)], token_delay=0.03)
    run = await ask(api_only, sid)
    await until_streaming(api_only, run["id"], 1)
    workers.kill_and_replace()
    await until_streaming(api_only, run["id"], 2)
    workers.kill_and_replace()
    done = await ended_run(api_only, run["id"])
    assert done["status"] == "failed" and done["error"]["code"] == "worker_lost", done
    await assert_one_terminal_and_dense(api_only, run["id"])
    upstream.clear()
    upstream.script(Text("next"))
    nxt = await ended_run(api_only, (await ask(api_only, sid))["id"])
    assert (nxt["status"], nxt["result"]) == ("completed", "next")


async def until_registered(settings: Settings, count: int) -> None:
    """Until exactly `count` workers are registered with procrastinate."""
    assert settings.database_url is not None
    conn = await asyncpg.connect(libpq_url(settings.database_url))
    try:
        query = "SELECT count(*) FROM procrastinate_workers"
        for _ in range(1200):
            if await conn.fetchval(query) == count:
                return
            await asyncio.sleep(0.1)
        raise AssertionError(f"never {count} registered workers")
    finally:
        await conn.close()


@pytest.mark.slow
async def test_a_paused_worker_keeps_its_run_and_takes_jobs_again(
    api_only: httpx.AsyncClient,
    upstream: FakeUpstream,
    workers: Workers,
    crash_settings: Settings,
) -> None:
    sid = (await new_session(api_only))["id"]
    release = threading.Event()
    upstream.script(Text("held "), Hold(release), Text("answer"))
    paused = workers.processes[-1]
    run = await ask(api_only, sid)
    await until_streaming(api_only, run["id"], 1)
    workers.start()
    await until_registered(crash_settings, 2)
    workers.pause(paused)
    # Past the stall threshold the other worker prunes the paused one's registration.
    await until_registered(crash_settings, 1)
    workers.resume(paused)
    release.set()
    done = await ended_run(api_only, run["id"])
    assert (done["status"], done["result"], done["attempts"]) == ("completed", "held answer", 1)
    events = await assert_one_terminal_and_dense(api_only, run["id"])
    assert "message.reset" not in [e.type for e in events]
    # With the other worker gone, the once-paused one must take the next ask.
    workers.processes[-1].kill()
    upstream.script(Text("still working"))
    nxt = await ended_run(api_only, (await ask(api_only, sid))["id"])
    assert (nxt["status"], nxt["result"]) == ("completed", "still working")


async def deregister_all(settings: Settings) -> None:
    assert settings.database_url is not None
    conn = await asyncpg.connect(libpq_url(settings.database_url))
    try:
        await conn.execute("DELETE FROM procrastinate_workers")
    finally:
        await conn.close()


@pytest.mark.slow
@pytest.mark.parametrize("worker_settings", [{"stall_check_seconds": 3600}])
async def test_a_worker_deregistered_behind_its_back_takes_the_next_job(
    api_only: httpx.AsyncClient, upstream: FakeUpstream, workers: Workers, crash_settings: Settings
) -> None:
    # A paused worker pruned by another fetched its next job before it noticed: the job's
    # foreign key to its registration failed, procrastinate stopped the worker's loop, and the
    # process took no job again (CI: the next ask stayed queued). The stall check that would
    # register it again is an hour away here: only the fetch itself can recover.
    sid = (await new_session(api_only))["id"]
    upstream.script(Text("first"))
    first = await ended_run(api_only, (await ask(api_only, sid))["id"])
    assert first["status"] == "completed", first
    await until_registered(crash_settings, 1)
    await deregister_all(crash_settings)
    for answer in ("second", "third"):
        upstream.script(Text(answer))
        run = await ended_run(api_only, (await ask(api_only, sid))["id"], within=120)
        assert (run["status"], run["result"]) == ("completed", answer), run
    await until_registered(crash_settings, 1)


@contextlib.asynccontextmanager
async def failing(settings: Settings, function: str) -> AsyncIterator[asyncpg.Connection]:
    """While in the block, procrastinate's SQL `function` (its signature) raises, counting its
    calls in the sequence `failures` (a sequence survives the rollback); then it is put back."""
    assert settings.database_url is not None
    conn = await asyncpg.connect(libpq_url(settings.database_url))
    try:
        original, name, arguments, returns = await conn.fetchrow(
            "SELECT pg_get_functiondef(oid), proname, pg_get_function_arguments(oid),"
            f" pg_get_function_result(oid) FROM pg_proc WHERE oid = '{function}'::regprocedure"
        )
        await conn.execute("CREATE SEQUENCE IF NOT EXISTS failures")
        await conn.execute(
            f"CREATE OR REPLACE FUNCTION {name}({arguments}) RETURNS {returns} LANGUAGE plpgsql"
            " AS $$ BEGIN PERFORM nextval('failures'); RAISE 'injected failure'; END $$"
        )
        yield conn
    finally:
        await conn.execute(original)
        await conn.close()


async def until_failed(conn: asyncpg.Connection, times: int) -> None:
    for _ in range(1200):
        query = "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM failures"
        if await conn.fetchval(query) >= times:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"never failed {times} times")


@pytest.mark.slow
async def test_a_worker_whose_heartbeats_fail_keeps_its_run_and_takes_the_next_job(
    api_only: httpx.AsyncClient, upstream: FakeUpstream, workers: Workers, crash_settings: Settings
) -> None:
    # A failed heartbeat (a database blip) stopped procrastinate's worker for good: its run
    # was left to finish, and the process never took another job.
    sid = (await new_session(api_only))["id"]
    release = threading.Event()
    upstream.script(Text("held "), Hold(release), Text("answer"))
    run = await ask(api_only, sid)
    await until_streaming(api_only, run["id"], 1)
    async with failing(crash_settings, "procrastinate_update_heartbeat_v1(bigint)") as conn:
        await until_failed(conn, 3)
    release.set()
    done = await ended_run(api_only, run["id"])
    assert (done["status"], done["result"], done["attempts"]) == ("completed", "held answer", 1)
    upstream.script(Text("next"))
    nxt = await ended_run(api_only, (await ask(api_only, sid))["id"], within=120)
    assert (nxt["status"], nxt["result"]) == ("completed", "next"), nxt


@pytest.mark.slow
async def test_a_worker_whose_job_fetch_fails_is_started_again(
    api_only: httpx.AsyncClient, upstream: FakeUpstream, workers: Workers, crash_settings: Settings
) -> None:
    # Any other error in procrastinate's loop stops its worker too: the pool starts it again.
    sid = (await new_session(api_only))["id"]
    upstream.script(Text("after the fault"))
    fetch = "procrastinate_fetch_job_v2(character varying[], bigint)"
    async with failing(crash_settings, fetch) as conn:
        run = await ask(api_only, sid)
        await until_failed(conn, 2)  # the worker was started again, and fetched again
    done = await ended_run(api_only, run["id"], within=120)
    assert (done["status"], done["result"]) == ("completed", "after the fault"), done


@pytest.fixture
def recovery_settings(database_url: str, upstream: FakeUpstream) -> tuple[Settings, str]:
    """A database of its own (no other test's workers take these runs), and a key."""
    settings = Settings(database_url=create_database(database_url, "recovery"), **e2e_env(upstream))
    return settings, issue_key(settings, f"recovery-{uuid.uuid4()}")


async def asked_in_a_new_session(
    engine: AsyncEngine, settings: Settings, key: str
) -> tuple[str, asks.AskResult]:
    """The key's tenant, and an ask of it in a new session (its run queued: no worker here)."""
    tenant = await tenant_for_key(engine, key)
    assert tenant is not None
    session = await create_session(engine, tenant, title=None, metadata={}, config={})
    return tenant, await asks.ask(engine, settings, tenant, session.id, asks.AskParams("q"))


async def job_status(engine: AsyncEngine, job_id: int | None) -> str:
    async with engine.connect() as conn:
        query = text("SELECT status FROM procrastinate_jobs WHERE id = :id")
        return str((await conn.execute(query, {"id": job_id})).scalar_one())


async def test_a_cancel_while_recovery_queues_a_dead_workers_run_again_leaves_its_job_to_the_worker(
    recovery_settings: tuple[Settings, str],
) -> None:
    """A worker died mid-run; the recovery queued the run again (a new job, no lease) and a
    worker took that job; then the run was cancelled, before that worker started it. The
    cancel took the run for one nobody held and ended its job, so the worker's own finish of
    the job failed: "Job was not found or not in "doing" or "todo" status" (ConnectorException,
    "Task exception was never retrieved"). The job is the worker's: it ends the run cancelled,
    then finishes the job as procrastinate's worker does."""
    settings, key = recovery_settings
    engine = create_engine(settings)
    try:
        tenant, asked = await asked_in_a_new_session(engine, settings, key)
        run_id, first_job = asked.run.id, asked.run.job_id
        # The first worker takes the job and starts the run under its lease, then dies: its
        # lease (a session advisory lock) goes with its connection.
        dead_lease = WorkerLease(engine)
        await dead_lease.acquire()
        dead = Runtime(engine, settings, Router(settings), EventWriter(engine), dead_lease)
        app = queue_app(settings, dead, 1)
        async with app.open_async():
            dead_worker = await app.job_manager.register_worker()
            taken = await app.job_manager.fetch_job(queues=[RUN_QUEUE], worker_id=dead_worker)
            assert taken is not None and taken.id == first_job
            async with engine.begin() as conn:
                started = await start_locked(
                    conn, dead, await runs_db.get_run(conn, run_id, lock=True)
                )
            assert started is not None and started.lease == dead_lease.key
            await dead_lease.release()

            # The recovery queues the run again: a new job, the dead one's ended.
            assert await recover_orphaned_runs(engine, lease_grace_seconds=0) == [run_id]
            async with engine.connect() as conn:
                requeued = await runs_db.get_run(conn, run_id)
            assert requeued is not None and requeued.lease is None
            assert requeued.job_id != first_job
            assert await job_status(engine, first_job) == "failed"

            # A live worker takes the new job; the cancel comes before it starts the run.
            lease = WorkerLease(engine)
            await lease.acquire()
            runtime = Runtime(engine, settings, Router(settings), EventWriter(engine), lease)
            worker = await app.job_manager.register_worker()
            job = await app.job_manager.fetch_job(queues=[RUN_QUEUE], worker_id=worker)
            assert job is not None and job.id == requeued.job_id
            await runs.cancel_run(engine, tenant, run_id)

            # The worker runs its job, then finishes it (procrastinate's worker does both).
            await execute_run(runtime, run_id, lambda: None)
            await app.job_manager.finish_job(job=job, status=Status.SUCCEEDED, delete_job=False)
            await lease.release()
        assert await job_status(engine, job.id) == "succeeded"
        async with engine.connect() as conn:
            ended = await runs_db.get_run(conn, run_id)
            ends = await conn.scalar(
                text("SELECT count(*) FROM entries WHERE session_id = :id AND kind = 'run_end'"),
                {"id": asked.run.session_id},
            )
            terminal = await conn.scalars(
                text(
                    "SELECT type FROM run_events WHERE run_id = :id"
                    " AND type IN ('run.completed', 'run.failed', 'run.cancelled')"
                ),
                {"id": run_id},
            )
            assert list(terminal) == ["run.cancelled"]
        assert ended is not None and ended.status is RunStatus.CANCELLED
        assert ends == 1
    finally:
        await engine.dispose()


async def test_the_recovery_leaves_a_busy_sessions_runs_for_its_next_look(
    recovery_settings: tuple[Settings, str],
) -> None:
    """A run being cancelled whose job ended without ending it: the recovery ends it, which
    writes its session. While an ask holds the session's row (it may go on to lock the run, to
    steer it), the recovery takes neither row and does not wait: it took the run's row, then
    waited for the session's, and the ask waiting for the run made a deadlock. Once the ask
    is done, the next look ends the run."""
    settings, key = recovery_settings
    engine = create_engine(settings)
    try:
        _, asked = await asked_in_a_new_session(engine, settings, key)
        run_id = asked.run.id
        async with engine.begin() as conn:
            await runs_db.update_run(conn, run_id, {"cancel_mode": "cancel"})
            await conn.execute(
                text("UPDATE procrastinate_jobs SET status = 'failed' WHERE id = :id"),
                {"id": asked.run.job_id},
            )
        async with holding_session(engine, asked.run.session_id) as holder:
            recovery = recover_orphaned_runs(engine, lease_grace_seconds=0)
            assert await never_waiting_for(engine, holder, recovery) == []
            locked = await runs_db.get_run(holder, run_id, lock=True)  # the ask goes on
            assert locked is not None and locked.active
        assert await recover_orphaned_runs(engine, lease_grace_seconds=0) == [run_id]
        async with engine.connect() as conn:
            ended = await runs_db.get_run(conn, run_id)
        assert ended is not None and ended.status is RunStatus.CANCELLED
    finally:
        await engine.dispose()
