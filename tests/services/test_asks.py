"""An ask's commit: an idle session's without its row locked first (a read, then one statement
written only if the row is still the one read), and under the lock when it is not."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.config import Settings
from app.core.entries import EntryKind, NewEntry, PendingEntry
from app.db import sessions as sessions_db
from app.services import asks, quotas
from app.services.errors import Conflict
from app.services.journal import append_in
from app.services.projection import Answer, project_session
from testkit.locks import holding_session, waiting_for_a_lock
from testkit.statements import own_engine, watching
from tests.db.test_runs import new_session, what_is_stored
from tests.services.test_run_transitions import ask_entries, asked_in

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
