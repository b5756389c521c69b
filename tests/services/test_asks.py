"""An ask's commit: an idle session's without its row locked first (a read, then one statement
written only if the row is still the one read), and under the lock when it is not."""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import replace

import asyncpg
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.config import Settings
from app.core.entries import EntryKind, NewEntry, PendingEntry
from app.core.runs import RunStatus
from app.db import jobs as jobs_db
from app.db import runs as runs_db
from app.db import sessions as sessions_db
from app.db.engine import libpq_url
from app.eventlog import store as event_store
from app.services import asks, quotas
from app.services.errors import Conflict
from app.services.journal import append_in
from app.services.projection import Answer, project_session
from testkit.locks import holding_session, waiting_for_a_lock
from testkit.statements import own_engine, watching
from tests.db.test_runs import new_session, what_is_stored
from tests.services.test_run_transitions import ask_entries, asked_in
from tests.worker.test_handoff import Reserved

NO_LIMITS = quotas.Limits()  # the request's key read them: none set


async def journal_of(engine: AsyncEngine, session_id: str) -> list[tuple[int, str, str]]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT seq, kind, payload->>'content' FROM entries WHERE session_id = :id"
                " ORDER BY seq"
            ),
            {"id": session_id},
        )
        return [(r[0], r[1], r[2]) for r in rows]


async def test_an_idle_sessions_ask_is_a_read_and_one_statement_with_no_transaction(
    settings: Settings,
) -> None:
    async with own_engine(settings) as engine:
        tenant, session_id = await new_session(engine)
        with watching(engine) as seen:
            asked = await asks.ask(
                engine, settings, tenant, session_id, asks.AskParams("hi"), own_limits=NO_LIMITS
            )
        assert seen.in_transaction == [False, False]  # two statements, each its own
        assert "FOR UPDATE" not in seen.statements[0]
        assert asked.created and asked.run.user_entry_seq == 1
        assert asked.first_event is not None and asked.context is not None
        assert await journal_of(engine, session_id) == [
            (1, "message", "hi"),
            (2, "run_start", None),
        ]
        async with engine.connect() as conn:
            session = await sessions_db.get_session(conn, tenant, session_id)
        assert session is not None and (session.rev, session.status.value) == (2, "active")
        assert await what_is_stored(engine, asked.run.id) == {"runs": 1, "jobs": 1, "events": 1}

        # A session with a run under way (or limits that count runs) commits under its lock,
        # once the read shows it.
        with watching(engine) as seen:
            await asks.ask(
                engine,
                settings,
                tenant,
                session_id,
                asks.AskParams("again", multitask_strategy="enqueue"),
                own_limits=NO_LIMITS,
            )
        assert not seen.in_transaction[0] and all(seen.in_transaction[1:])
        assert "FOR UPDATE" in seen.statements[1]


async def test_a_write_on_a_session_changed_since_it_was_read_writes_nothing(
    engine: AsyncEngine,
) -> None:
    tenant, session_id = await new_session(engine)
    async with engine.connect() as conn:
        found = await sessions_db.get_session_as_read(conn, tenant, session_id)
    assert found is not None
    version = found.version
    async with engine.begin() as conn:  # the row is written, not its rev: a new title
        await conn.execute(
            text("UPDATE sessions SET title = 'renamed' WHERE id = :id"), {"id": session_id}
        )
    run_id = str(uuid.uuid4())
    async with engine.begin() as conn:  # a worker of this process would have taken its job
        worker = text("INSERT INTO procrastinate_workers DEFAULT VALUES RETURNING id")
        worker_id = int((await conn.execute(worker)).scalar_one())
        queued = await asked_in(
            conn,
            tenant,
            session_id,
            run_id,
            ask_entries(run_id),
            input_at=0,
            claim_for=worker_id,
            unchanged=version,
        )
    assert queued is None
    assert await what_is_stored(engine, run_id) == {"runs": 0, "jobs": 0, "events": 0}
    assert await journal_of(engine, session_id) == []
    async with engine.connect() as conn:
        session = await sessions_db.get_session(conn, tenant, session_id)
    assert session is not None and (session.rev, session.status.value) == (0, "idle")


async def test_an_ask_whose_session_is_written_while_it_commits_commits_under_the_lock(
    engine: AsyncEngine, settings: Settings
) -> None:
    """The ask read the session idle; another ask holding the row commits a run. The ask's
    statement waits for the row, finds it changed, writes nothing, and the ask commits again
    under the lock, which finds the other's run under way: refused (multitask_strategy
    reject), where the row as read would have let it start a second run."""
    tenant, session_id = await new_session(engine)
    other_run = str(uuid.uuid4())
    async with holding_session(engine, session_id) as other:
        entries = ask_entries(other_run, "first")
        await asked_in(other, tenant, session_id, other_run, entries, input_at=0)
        asking = asyncio.ensure_future(
            asks.ask(
                engine, settings, tenant, session_id, asks.AskParams("second"), own_limits=NO_LIMITS
            )
        )
        await waiting_for_a_lock(engine, asking, "%UPDATE sessions%xmin%")
    with pytest.raises(Conflict) as refused:
        await asking
    assert refused.value.code == "session_busy"
    assert refused.value.details == {"active_run_id": other_run}
    assert await journal_of(engine, session_id) == [(1, "message", "first"), (2, "run_start", None)]
    async with engine.connect() as conn:
        runs_of = (
            await conn.execute(
                text("SELECT count(*) FROM runs WHERE session_id = :id"), {"id": session_id}
            )
        ).scalar_one()
        jobs_of = (
            await conn.execute(
                text("SELECT count(*) FROM procrastinate_jobs WHERE lock LIKE :lock"),
                {"lock": f"%{session_id}%"},
            )
        ).scalar_one()
    assert (runs_of, jobs_of) == (1, 1)


@pytest.mark.parametrize(("history", "reads_further"), [(40, False), (300, True)])
async def test_an_idle_sessions_ask_projects_from_the_newest_entries_read_with_its_session(
    settings: Settings, history: int, reads_further: bool
) -> None:
    """The ask's read of its session brings the thread's newest entries: a projection they
    cover reads nothing more; one that reaches back further reads the thread then. Either way
    the ask sends what a dry run of it computes."""
    async with own_engine(settings) as engine:
        tenant, session_id = await new_session(engine)
        earlier = [
            NewEntry(EntryKind.MESSAGE, {"role": role, "content": f"{role} {i}"}, {})
            for i in range(history)
            for role in ("user", "assistant")
        ][:history]
        async with engine.begin() as conn:
            await append_in(conn, tenant, session_id, earlier)
        asked_for = asks.AskParams("and now?")
        dry = await project_session(
            engine,
            settings,
            tenant,
            session_id,
            pending=[PendingEntry("message", {"role": "user", "content": "and now?"})],
            answer=Answer(None, None),
        )
        with watching(engine) as seen:
            asked = await asks.ask(
                engine, settings, tenant, session_id, asked_for, own_limits=NO_LIMITS
            )
        assert not any(seen.in_transaction)
        assert (len(seen.statements) > 2) == reads_further  # (the thread's pages, then)
        assert asked.context == dry.projection.meta
        assert dry.projection.meta.entries_included == history


async def new_worker(engine: AsyncEngine) -> int:
    """A procrastinate worker registration, as this process's handoff has."""
    async with engine.begin() as conn:
        worker = text("INSERT INTO procrastinate_workers DEFAULT VALUES RETURNING id")
        return int((await conn.execute(worker)).scalar_one())


async def asked_through(
    engine: AsyncEngine, settings: Settings, tenant: str, session_id: str, handoff: Reserved
) -> asks.AskResult:
    """An ask of the session (no limits), with this process's handoff as `handoff`."""
    params = asks.AskParams("hi")
    return await asks.ask(
        engine, settings, tenant, session_id, params, own_limits=NO_LIMITS, handoff=handoff
    )


async def test_an_asks_run_whose_job_its_handoff_takes_is_committed_started_as_its_start_reads(
    settings: Settings, database_url: str
) -> None:
    """The ask's statement takes the job for this process's worker and starts the run under
    that worker's lease: status, attempt, lease and start event as the run's own start would
    write them, announced with the commit; and what it hands the run (AskResult.started) is
    what that start would read of the session (read_for_run), the statement's row version
    included."""
    async with own_engine(settings) as engine:
        tenant, session_id = await new_session(engine)
        handoff = Reserved(await new_worker(engine), lease=2**40 + 7)
        heard: asyncio.Queue[str] = asyncio.Queue()
        listener = await asyncpg.connect(libpq_url(database_url))
        await listener.add_listener(event_store.CHANNEL, lambda *a: heard.put_nowait(a[-1]))
        try:
            with watching(engine) as seen:
                asked = await asked_through(engine, settings, tenant, session_id, handoff)
            told = [json.loads(await asyncio.wait_for(heard.get(), 30)) for _ in range(2)]
        finally:
            await listener.close()
        assert seen.in_transaction == [False, False]  # still a read and one statement
        run_id = asked.run.id
        assert told == [{"runs": {run_id: 1}}, {"runs": {run_id: 2}}]
        started = asked.started
        assert asked.claimed and started is not None and handoff.started == [started]
        async with engine.connect() as conn:
            stored = await runs_db.get_run(conn, run_id)
            events = await event_store.read_events(conn, run_id, 0, tenant_id=tenant)
            assert stored is not None
            read = await sessions_db.read_for_run(
                conn, tenant, session_id, run_id, stored.input_seq
            )
        assert stored == started.run == asked.run
        assert (stored.status, stored.attempts, stored.lease) == (RunStatus.RUNNING, 1, 2**40 + 7)
        assert stored.started_at is not None
        assert [(e["seq"], e["type"], e["data"]) for e in events][1:] == [
            (2, "run.started", {"attempt": 1})
        ]
        assert (started.event_seq, started.steered) == (2, False)
        # The session, its row's version, what the run wrote (its ask's entries), the thread's
        # newest entries (read back to its start, as a Newest read to it).
        given, newest = replace(started.start, newest=None), started.start.newest
        assert given == replace(read, newest=None) and newest is not None
        assert read.newest is not None and newest.entries == read.newest.entries
        assert newest.reaches_start and read.newest.reaches_start


async def test_an_asks_run_whose_job_its_sessions_queue_holds_back_is_committed_queued(
    settings: Settings,
) -> None:
    """Another job of the session's lock is running: the ask's job is deferred, so its run is
    committed queued, with no start event, for the worker that takes the job to start."""
    async with own_engine(settings) as engine:
        tenant, session_id = await new_session(engine)
        async with engine.begin() as conn:
            await conn.execute(
                text(
                    "INSERT INTO procrastinate_jobs (queue_name, task_name, lock, args, status)"
                    " VALUES ('runs', 'other', :lock, '{}', 'doing')"
                ),
                {"lock": jobs_db.session_lock(session_id)},
            )
        handoff = Reserved(await new_worker(engine), lease=2**40 + 8)
        asked = await asked_through(engine, settings, tenant, session_id, handoff)
        assert not asked.claimed and asked.started is None and handoff.started == [None]
        async with engine.connect() as conn:
            stored = await runs_db.get_run(conn, asked.run.id)
            events = await event_store.read_events(conn, asked.run.id, 0, tenant_id=tenant)
        assert stored is not None
        assert (stored.status, stored.attempts, stored.lease) == (RunStatus.QUEUED, 0, None)
        assert stored.started_at is None
        assert [e["type"] for e in events] == ["run.created"]
