"""A run's creation is one statement: its job, its row and its run.created event, all or none."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import asyncpg
import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from app.core.runs import RunKind, RunStatus
from app.db import jobs as jobs_db
from app.db import runs as runs_db
from app.db.engine import libpq_url
from app.eventlog import store as event_store
from app.services.keys import create_key, tenant_for_key
from app.services.sessions import create_session


async def new_session(engine: AsyncEngine) -> tuple[str, str]:
    tenant = await tenant_for_key(engine, await create_key(engine, f"runs-{uuid.uuid4()}"))
    assert tenant is not None
    session = await create_session(engine, tenant, title=None, metadata={}, config={})
    return tenant, session.id


def run_values(tenant: str, session: str, key: str | None = None) -> dict[str, Any]:
    run_id = str(uuid.uuid4())
    return {
        "id": run_id,
        "tenant_id": tenant,
        "session_id": session,
        "kind": "ask",
        "model": "openai:gpt-4o-mini",
        "params": {"metadata": {"k": "v"}},
        "idempotency_key": key,
        "user_entry_seq": 7,
    }


def created(values: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return event_store.run_event("run.created", {"run_id": values["id"], "kind": "ask"})


async def what_is_stored(engine: AsyncEngine, run_id: str) -> dict[str, Any]:
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                text(
                    "SELECT (SELECT count(*) FROM runs WHERE id = CAST(:id AS uuid)) AS runs,"
                    " (SELECT count(*) FROM procrastinate_jobs"
                    "  WHERE args->>'run_id' = CAST(:id AS text)) AS jobs,"
                    " (SELECT count(*) FROM run_events WHERE run_id = CAST(:id AS uuid)) AS events"
                ),
                {"id": run_id},
            )
        ).one()
    return {"runs": row.runs, "jobs": row.jobs, "events": row.events}


async def test_the_run_its_job_and_its_first_event_are_written_and_announced_together(
    engine: AsyncEngine, database_url: str
) -> None:
    tenant, session = await new_session(engine)
    values = run_values(tenant, session, key="k-1")
    heard: asyncio.Queue[str] = asyncio.Queue()
    listener = await asyncpg.connect(libpq_url(database_url))
    await listener.add_listener(event_store.CHANNEL, lambda *args: heard.put_nowait(args[-1]))
    try:
        async with engine.begin() as conn:
            run = (await runs_db.insert_queued_run(conn, created(values), **values)).run
            assert heard.empty()  # not before the commit
        payload = json.loads(await asyncio.wait_for(heard.get(), 30))
    finally:
        await listener.close()
    assert payload == {"runs": {values["id"]: 1}}
    assert (run.id, run.session_id, run.kind, run.status) == (
        values["id"],
        session,
        RunKind.ASK,
        RunStatus.QUEUED,
    )
    assert (run.idempotency_key, run.user_entry_seq, run.params.metadata) == ("k-1", 7, {"k": "v"})
    async with engine.connect() as conn:
        job = (
            (
                await conn.execute(
                    text("SELECT lock, task_name, args FROM procrastinate_jobs WHERE id = :id"),
                    {"id": run.job_id},
                )
            )
            .mappings()
            .one()
        )
        events = await event_store.read_events(conn, run.id, 0, tenant_id=tenant)
        stored = await runs_db.get_run(conn, run.id)
    assert dict(job) == {
        "lock": jobs_db.session_lock(session),
        "task_name": jobs_db.RUN_TASK,
        "args": {"run_id": run.id},
    }
    assert [(e["seq"], e["type"], e["data"]) for e in events] == [
        (1, "run.created", {"run_id": run.id, "kind": "ask"})
    ]
    assert stored == run  # what came back is the row as stored


async def test_a_run_refused_by_its_idempotency_key_leaves_no_job_and_no_event(
    engine: AsyncEngine,
) -> None:
    """The loser of an Idempotency-Key race fails on the unique index: the statement that
    deferred its job and wrote its event fails whole, whatever its transaction does next."""
    tenant, session = await new_session(engine)
    first = run_values(tenant, session, key="same")
    async with engine.begin() as conn:
        await runs_db.insert_queued_run(conn, created(first), **first)
    second = run_values(tenant, session, key="same")
    async with engine.connect() as conn:
        await conn.begin()
        with pytest.raises(IntegrityError, match="runs_idempotency_key"):
            async with conn.begin_nested():  # the statement alone is undone: a savepoint
                await runs_db.insert_queued_run(conn, created(second), **second)
        await conn.commit()  # what else the transaction did stands; nothing of the run
    assert await what_is_stored(engine, second["id"]) == {"runs": 0, "jobs": 0, "events": 0}
    assert await what_is_stored(engine, first["id"]) == {"runs": 1, "jobs": 1, "events": 1}


async def new_worker(engine: AsyncEngine) -> int:
    async with engine.begin() as conn:
        query = text("INSERT INTO procrastinate_workers DEFAULT VALUES RETURNING id")
        return int((await conn.execute(query)).scalar_one())


async def job_of(engine: AsyncEngine, job_id: int | None) -> tuple[str, int | None]:
    async with engine.connect() as conn:
        query = text("SELECT status, worker_id FROM procrastinate_jobs WHERE id = :id")
        row = (await conn.execute(query, {"id": job_id})).one()
    return str(row.status), row.worker_id


async def test_a_job_claimed_at_insert_is_taken_by_the_worker_and_wakes_no_worker(
    engine: AsyncEngine, database_url: str
) -> None:
    """With its session's lock free, the run's job is committed 'doing' under the given
    worker: procrastinate's workers are not told of it (no NOTIFY, as for a job they took)."""
    tenant, session = await new_session(engine)
    worker_id = await new_worker(engine)
    values = run_values(tenant, session)
    told: asyncio.Queue[str] = asyncio.Queue()
    listener = await asyncpg.connect(libpq_url(database_url))
    await listener.add_listener("procrastinate_any_queue_v1", lambda *a: told.put_nowait(a[-1]))
    try:
        async with engine.begin() as conn:
            queued = await runs_db.insert_queued_run(
                conn, created(values), **values, claim_for=worker_id
            )
        # A job deferred after it is announced on the same connection, after it: once that
        # one is heard, the claimed one would have been heard before.
        async with engine.begin() as conn:
            later = await jobs_db.defer_run(conn, str(uuid.uuid4()), str(uuid.uuid4()))
        heard = json.loads(await asyncio.wait_for(told.get(), 30))
    finally:
        await listener.close()
    assert heard["job_id"] == later
    assert queued.claimed and queued.run.status is RunStatus.QUEUED
    assert await job_of(engine, queued.run.job_id) == ("doing", worker_id)
    assert await what_is_stored(engine, values["id"]) == {"runs": 1, "jobs": 1, "events": 1}


@pytest.mark.parametrize("ahead", ["todo", "doing"])
async def test_a_job_behind_another_of_its_session_stays_queued(
    engine: AsyncEngine, ahead: str
) -> None:
    """procrastinate's fetch takes a lock's jobs one at a time, in order: a run queued behind
    another of its session (multitask_strategy enqueue) is not claimed at insert."""
    tenant, session = await new_session(engine)
    worker_id = await new_worker(engine)
    first = run_values(tenant, session)
    async with engine.begin() as conn:
        earlier = await runs_db.insert_queued_run(conn, created(first), **first)
        if ahead == "doing":
            await conn.execute(
                text("UPDATE procrastinate_jobs SET status = 'doing' WHERE id = :id"),
                {"id": earlier.run.job_id},
            )
    second = run_values(tenant, session)
    async with engine.begin() as conn:
        queued = await runs_db.insert_queued_run(
            conn, created(second), **second, claim_for=worker_id
        )
    assert not queued.claimed
    assert await job_of(engine, queued.run.job_id) == ("todo", None)
    # Another session's lock is free: its job is claimed.
    _, other = await new_session(engine)
    third = run_values(tenant, other)
    async with engine.begin() as conn:
        claimed = await runs_db.insert_queued_run(
            conn, created(third), **third, claim_for=worker_id
        )
    assert claimed.claimed
    assert await job_of(engine, claimed.run.job_id) == ("doing", worker_id)


async def test_a_compaction_queued_first_does_not_keep_an_ask_from_being_claimed(
    engine: AsyncEngine,
) -> None:
    """A compaction's job has a lock of its own (jobs_db.session_lock): procrastinate's fetch
    would take the ask's job beside it, and so does the claim."""
    tenant, session = await new_session(engine)
    worker_id = await new_worker(engine)
    async with engine.begin() as conn:
        await jobs_db.defer_run(conn, str(uuid.uuid4()), session, "compaction")
    values = run_values(tenant, session)
    async with engine.begin() as conn:
        queued = await runs_db.insert_queued_run(
            conn, created(values), **values, claim_for=worker_id
        )
    assert queued.claimed


async def test_a_lock_taken_by_a_concurrent_fetch_leaves_the_job_queued(
    engine: AsyncEngine,
) -> None:
    """A job of the same lock that a worker takes while the insert runs (not yet seen by it)
    wins on procrastinate's unique index of running locks: the run's job is deferred instead,
    and the ask does not fail."""
    tenant, session = await new_session(engine)
    worker_id = await new_worker(engine)
    async with engine.connect() as fetcher:
        await fetcher.begin()
        other = await jobs_db.defer_run(fetcher, str(uuid.uuid4()), session)
        await fetcher.execute(
            text("UPDATE procrastinate_jobs SET status = 'doing' WHERE id = :id"), {"id": other}
        )
        values = run_values(tenant, session)
        async with engine.begin() as conn:
            inserting = asyncio.create_task(
                runs_db.insert_queued_run(conn, created(values), **values, claim_for=worker_id)
            )
            # The insert waits on the index for the fetcher's transaction, which then commits.
            await wait_for_lock_wait(engine)
            await fetcher.commit()
            queued = await inserting
    assert not queued.claimed
    assert await job_of(engine, queued.run.job_id) == ("todo", None)


async def wait_for_lock_wait(engine: AsyncEngine) -> None:
    async with engine.connect() as conn:
        for _ in range(600):
            waiting = await conn.scalar(
                text(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE wait_event_type = 'Lock' AND query LIKE 'WITH claimed AS%'"
                )
            )
            if waiting:
                return
            await asyncio.sleep(0.1)
    raise AssertionError("the insert never waited for the other transaction")


async def test_a_sessions_active_runs_are_found_by_its_tenant_only(engine: AsyncEngine) -> None:
    tenant, session = await new_session(engine)
    other, _ = await new_session(engine)
    values = run_values(tenant, session)
    async with engine.begin() as conn:
        run = (await runs_db.insert_queued_run(conn, created(values), **values)).run
    async with engine.connect() as conn:
        mine = await runs_db.active_runs(conn, session, tenant_id=tenant)
        assert [r.id for r in mine] == [run.id]
        assert await runs_db.active_runs(conn, session, kind="ask", tenant_id=other) == []
