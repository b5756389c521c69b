"""A run's first start in one statement (start_first) does what the start under the row's lock
does, for the runs it takes; every other run is left to that start, untouched."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import asyncpg
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.config import Settings
from app.core.entries import EntryKind, NewEntry
from app.core.runs import Outcome, Run, RunKind, RunParams, RunStatus
from app.core.usage import UsageReport
from app.db import runs as runs_db
from app.db import sessions as sessions_db
from app.db import steers as steers_db
from app.db import webhooks as webhooks_db
from app.db.engine import autocommit, libpq_url
from app.eventlog import store as event_store
from app.services import run_transitions
from app.services import runs as runs_service
from app.services.journal import append_in
from testkit.locks import holding_session, never_waiting_for, waiting_for_a_lock
from testkit.statements import own_engine, watching
from tests.db.test_runs import created, new_session, run_values

LEASE = 424242


async def queued_run(engine: AsyncEngine) -> Run:
    tenant, session = await new_session(engine)
    values = run_values(tenant, session)
    async with engine.begin() as conn:
        return (await runs_db.insert_queued_run(conn, created(values), **values)).run


async def start_first(
    engine: AsyncEngine, run_id: str, written: list[dict[str, object]] | None = None
) -> runs_db.FirstStart | None:
    async with autocommit(engine) as conn:
        first = await run_transitions.start_first(conn, run_id, LEASE, written)
        await conn.commit()
    return first


async def events_of(engine: AsyncEngine, run: Run) -> list[tuple[int, str, object]]:
    async with engine.connect() as conn:
        rows = await event_store.read_events(conn, run.id, 0, tenant_id=run.tenant_id)
    return [(r["seq"], r["type"], r["data"]) for r in rows]


async def test_a_first_start_is_the_locked_start_in_one_statement(
    engine: AsyncEngine, database_url: str
) -> None:
    fast, locked = await queued_run(engine), await queued_run(engine)
    heard: asyncio.Queue[str] = asyncio.Queue()
    listener = await asyncpg.connect(libpq_url(database_url))
    await listener.add_listener(event_store.CHANNEL, lambda *args: heard.put_nowait(args[-1]))
    written: list[dict[str, object]] = []
    try:
        first = await start_first(engine, fast.id, written)
        payload = json.loads(await asyncio.wait_for(heard.get(), 30))
    finally:
        await listener.close()
    async with engine.begin() as conn:
        row = await runs_db.get_run(conn, locked.id, lock=True)
        assert row is not None
        by_lock = await run_transitions.start(conn, row, LEASE)
    assert first is not None and not first.steered
    assert payload == {"runs": {fast.id: 2}}  # announced, with the seq it took
    assert first.event_seq == 2
    async with engine.connect() as conn:
        stored = await runs_db.get_run(conn, fast.id)
    assert stored == first.run  # what came back is the row as stored
    for run in (first.run, by_lock):
        assert (run.status, run.attempts, run.lease) == (RunStatus.RUNNING, 1, LEASE)
        assert run.started_at is not None
    assert await events_of(engine, first.run) == [
        (1, "run.created", {"run_id": fast.id, "kind": "ask"}),
        (2, "run.started", {"attempt": 1}),
    ]
    assert (await events_of(engine, by_lock))[1:] == [(2, "run.started", {"attempt": 1})]
    # the row its followers are handed is the row stored
    assert written == [{"run_id": fast.id, "seq": 2, "type": "run.started", "data": {"attempt": 1}}]


async def test_a_first_start_says_whether_a_steer_is_waiting(engine: AsyncEngine) -> None:
    run = await queued_run(engine)
    async with engine.begin() as conn:
        steer = steers_db.Steer(
            str(uuid.uuid4()), run.tenant_id, run.session_id, run.id, "faster", run.model, {}
        )
        await steers_db.insert_steer(conn, steer)
    first = await start_first(engine, run.id)
    assert first is not None and first.steered


async def test_a_run_being_cancelled_or_started_before_is_left_to_the_locked_start(
    engine: AsyncEngine,
) -> None:
    cancelling, started = await queued_run(engine), await queued_run(engine)
    async with engine.begin() as conn:
        await runs_db.update_run(conn, cancelling.id, {"cancel_mode": "cancel"})
    assert await start_first(engine, started.id) is not None
    for run in (cancelling, started):
        async with engine.connect() as conn:
            before = await runs_db.get_run(conn, run.id)
        events_before = await events_of(engine, run)
        assert await start_first(engine, run.id) is None
        async with engine.connect() as conn:
            assert await runs_db.get_run(conn, run.id) == before  # untouched
        assert await events_of(engine, run) == events_before
    assert await start_first(engine, str(uuid.uuid4())) is None  # no such run


async def test_a_run_ends_when_its_end_commits_not_when_its_transaction_began(
    engine: AsyncEngine,
) -> None:
    """The end waits for the session's row while another transaction holds it (a
    burst of asks does): the run's ended_at is after that wait, not the time its transaction
    began. (A queue measured from ended_at saw the wait as a slow start of the next run.)"""
    run = (await start_first(engine, (await queued_run(engine)).id)).run  # type: ignore[union-attr]
    async with ending_behind_an_ask(engine, run) as (holder, ending):
        released = (await holder.execute(text("SELECT clock_timestamp()"))).scalar_one()
    ended = await ending

    assert ended.status is RunStatus.COMPLETED
    assert ended.ended_at is not None and ended.ended_at > released


async def test_a_session_is_idle_only_once_none_of_its_runs_is_under_way(
    engine: AsyncEngine,
) -> None:
    """What lets an ask skip reading the session's active runs when it finds the session idle:
    a run's creation marks its session active, and a run's end marks it idle only when no
    other run of it is active (a queued one behind it, or a compaction)."""
    tenant, session = await new_session(engine)

    async def status() -> str:
        async with engine.connect() as conn:
            found = await conn.scalar(
                text("SELECT status FROM sessions WHERE id = :id"), {"id": session}
            )
        return str(found)

    async def create(kind: RunKind) -> Run:
        async with engine.begin() as conn:
            queued = await run_transitions.create(
                conn,
                id=str(uuid.uuid4()),
                tenant_id=tenant,
                session_id=session,
                kind=kind,
                model="openai:gpt-4o-mini",
                params=RunParams(),
                idempotency_key=None,
            )
        return queued.run

    async def end(run: Run) -> None:  # a queued run ends cancelled
        async with engine.begin() as conn:
            locked = await runs_db.get_run(conn, run.id, lock=True)
            assert locked is not None
            await run_transitions.finish(conn, locked, Outcome("cancelled"))

    assert await status() == "idle"
    first, second = await create(RunKind.ASK), await create(RunKind.ASK)
    compaction = await create(RunKind.COMPACTION)
    assert await status() == "active"
    for run in (first, compaction):
        await end(run)
        assert await status() == "active"  # another run is still under way
    await end(second)
    assert await status() == "idle"


@contextlib.asynccontextmanager
async def ending_behind_an_ask(
    engine: AsyncEngine, run: Run
) -> AsyncIterator[tuple[AsyncConnection, asyncio.Task[Run]]]:
    """An ask's transaction holding `run`'s session's row (committed on leaving), and the
    run's end (its row locked, then finish) in a task, waiting for the ask's lock."""

    async def end() -> Run:
        async with engine.begin() as conn:
            locked = await runs_db.get_run(conn, run.id, lock=True)
            assert locked is not None
            return await run_transitions.finish(conn, locked, Outcome("completed", "done"))

    async with holding_session(engine, run.session_id) as ask:
        ending = asyncio.create_task(end())
        await waiting_for_a_lock(engine, ending, "%sessions%")
        yield ask, ending


async def test_a_run_ending_while_an_ask_commits_leaves_the_session_busy(
    engine: AsyncEngine,
) -> None:
    """An ask (enqueue) commits its run while a run of the session ends, the end waiting for
    the session's row: the session stays active, its new run under way. (The end's status
    update, waiting for the row, read the session's runs as they were before the wait, and
    marked the session idle: the next ask then skipped the busy check.)"""
    run = (await start_first(engine, (await queued_run(engine)).id)).run  # type: ignore[union-attr]
    async with ending_behind_an_ask(engine, run) as (ask, ending):
        queued = await run_transitions.create(
            ask,
            id=str(uuid.uuid4()),
            tenant_id=run.tenant_id,
            session_id=run.session_id,
            kind=RunKind.ASK,
            model=run.model,
            params=RunParams(),
            idempotency_key=None,
        )
    await ending
    async with engine.connect() as conn:
        status = await conn.scalar(
            text("SELECT status FROM sessions WHERE id = :id"), {"id": run.session_id}
        )
        still = await runs_db.get_run(conn, queued.run.id)
    assert still is not None and still.active
    assert status == "active"


async def test_a_run_ending_while_an_ask_steers_it_hands_the_steer_on(
    engine: AsyncEngine,
) -> None:
    """An ask steering a run locks its session, then the run; the run's end waits for them in
    the same order (never each holding what the other waits for: a deadlock, which failed one
    of them), and then finds the steer: it starts the next run."""
    run = (await start_first(engine, (await queued_run(engine)).id)).run  # type: ignore[union-attr]
    async with ending_behind_an_ask(engine, run) as (ask, ending):
        locked = await runs_db.get_run(ask, run.id, lock=True)
        assert locked is not None and locked.active
        steer_id = str(uuid.uuid4())
        steer = steers_db.Steer(
            steer_id, run.tenant_id, run.session_id, run.id, "and shorter", run.model, {}
        )
        await steers_db.insert_steer(ask, steer)
    ended = await ending
    assert ended.status is RunStatus.COMPLETED
    async with engine.connect() as conn:
        settled = await conn.execute(
            text("SELECT status, next_run_id FROM steers WHERE id = :id"), {"id": steer_id}
        )
        status, next_run_id = settled.one()
    assert status == "next_run" and next_run_id is not None
    steered = [data for _, kind, data in await events_of(engine, ended) if kind == "run.steered"]
    assert steered and steered[0]["steer_id"] == steer_id  # type: ignore[index]


def ask_entries(run_id: str, content: str = "hi") -> list[NewEntry]:
    """An ask's entries: its user message and run_start."""
    refs = {"run_id": run_id}
    return [
        NewEntry(EntryKind.MESSAGE, {"role": "user", "content": content}, refs, "i"),
        NewEntry(EntryKind.RUN_START, {"run_id": run_id, "model": "m"}, refs, "s"),
    ]


async def asked_in(
    conn: AsyncConnection,
    tenant: str,
    session_id: str,
    run_id: str,
    entries: list[NewEntry],
    input_at: int,
    **more: Any,
) -> runs_db.QueuedRun | None:
    """An ask's commit in `conn`'s transaction: its session locked (unless `more` says the
    version it was read at: create_asked's `unchanged`), its entries and run."""
    if "unchanged" not in more:
        await sessions_db.get_session(conn, tenant, session_id, lock=True)
    return await run_transitions.create_asked(
        conn,
        entries=entries,
        input_at=input_at,
        id=run_id,
        tenant_id=tenant,
        session_id=session_id,
        model="openai:gpt-4o-mini",
        params=RunParams(),
        idempotency_key=None,
        **more,
    )


async def test_an_asks_entries_and_run_in_one_statement_are_what_two_statements_write(
    engine: AsyncEngine,
) -> None:
    """An ask's entries and run (create_asked) in one statement, and, when an entry needs the
    append's checks (a rollback among them: its range is checked once its seq is known), in
    two: the same session, entries, run and run.created, which names the user entry's seq (and
    which the ask hands its stream, as stored)."""

    async def asked(session_id: str, tenant: str, rollback: bool) -> tuple[object, ...]:
        run_id = str(uuid.uuid4())
        refs = {"run_id": run_id}
        before = (
            [NewEntry(EntryKind.ROLLBACK, {"from_seq": 1, "to_seq": 1}, refs, f"{run_id}:rb")]
            if rollback
            else [NewEntry(EntryKind.MESSAGE, {"role": "assistant", "content": "hi"}, refs)]
        )
        entries = [
            *before,
            NewEntry(EntryKind.MESSAGE, {"role": "user", "content": "Name me"}, refs, run_id),
            NewEntry(EntryKind.RUN_START, {"run_id": run_id, "model": "m"}, refs, f"{run_id}:s"),
        ]
        async with engine.begin() as conn:
            queued = await asked_in(conn, tenant, session_id, run_id, entries, input_at=1)
        assert queued is not None
        async with engine.connect() as conn:
            session = await sessions_db.get_session(conn, tenant, session_id)
            stored = (
                await conn.execute(
                    text("SELECT seq, kind, id FROM entries WHERE session_id = :s ORDER BY seq"),
                    {"s": session_id},
                )
            ).all()
        assert session is not None
        events = await events_of(engine, queued.run)
        assert events == [(1, "run.created", queued.created["data"])]  # type: ignore[index]
        assert queued.created["data"]["user_entry_seq"] == queued.run.user_entry_seq  # type: ignore[index]
        return (
            session.rev,
            session.title,
            session.status,
            [(seq, kind) for seq, kind, _ in stored],
            queued.run.user_entry_seq,
            queued.run.status,
        )

    results = []
    for rollback in (False, True):
        tenant, session_id = await new_session(engine)
        async with engine.begin() as conn:  # the first entry, which the rollback takes back
            first = NewEntry(EntryKind.MESSAGE, {"role": "assistant", "content": "x"}, {})
            await append_in(conn, tenant, session_id, [first])
        results.append(await asked(session_id, tenant, rollback))
    one, two = results
    kinds = ["message", "message", "message", "run_start"]
    assert one == (
        4,
        "Name me",
        "active",
        list(zip(range(1, 5), kinds, strict=True)),
        3,
        RunStatus.QUEUED,
    )
    kinds[1] = "rollback"
    assert two == (
        4,
        "Name me",
        "active",
        list(zip(range(1, 5), kinds, strict=True)),
        3,
        RunStatus.QUEUED,
    )


@pytest.mark.parametrize("in_one_statement", [False, True])
async def test_a_runs_end_hands_its_followers_the_events_it_stored_steered_ones_first(
    engine: AsyncEngine, in_one_statement: bool
) -> None:
    """A run's end writes its last events in the statement that ends it, unless a steer is
    pending: then the steer's run.steered comes first and the terminal event last. Either way
    the rows handed to this process's followers are the rows stored. The worker's end (its
    entries in that statement too, at the seqs after the rev its lock read) writes what the
    end of any other caller does."""
    for steered in (False, True):
        run = (await start_first(engine, (await queued_run(engine)).id)).run  # type: ignore[union-attr]
        if steered:
            async with engine.begin() as conn:
                steer = steers_db.Steer(
                    str(uuid.uuid4()), run.tenant_id, run.session_id, run.id, "on", run.model, {}
                )
                await steers_db.insert_steer(conn, steer)
        written: list[dict[str, object]] = []
        outcome = Outcome("completed", "done", usage=UsageReport(10, 2))
        async with engine.begin() as conn:
            found = await runs_db.lock_with_rev(conn, run.id)
            assert found is not None
            locked, rev = found
            ended = await run_transitions.finish(
                conn, locked, outcome, written, session_rev=rev if in_one_statement else None
            )
        (_, status, input_tokens, output_tokens), kinds_stored, _, _ = await stored_of(engine, run)
        # the answer, usage and run_end (then, steered, the next run's message and run_start)
        assert kinds_stored[:3] == [(1, "message"), (2, "usage"), (3, "run_end")]
        assert ended.end_entry_seq == 3
        assert (input_tokens, output_tokens) == (10, 2)
        assert status == ("active" if steered else "idle")  # the steer's next run
        stored = await events_of(engine, run)
        assert [(r["seq"], r["type"], r["data"]) for r in written] == stored[2:]
        kinds = [kind for _, kind, _ in stored[2:]]
        assert kinds[-1] == "run.completed" and kinds.count("run.completed") == 1
        assert ("run.steered" in kinds) == steered
        if steered:
            assert kinds.index("run.steered") < kinds.index("entry.committed")


async def test_a_first_start_reads_what_its_run_reads_of_its_session_to_start(
    engine: AsyncEngine,
) -> None:
    """The statement that starts a run also reads what the run reads of its session to start
    (read_for_run): its session, whether a compaction is under way, what the run wrote (its
    user entry and run_start) and the thread's newest entries."""
    tenant, session_id = await new_session(engine)
    run_id = str(uuid.uuid4())
    async with engine.begin() as conn:
        earlier = NewEntry(EntryKind.MESSAGE, {"role": "assistant", "content": "hello"}, {})
        await append_in(conn, tenant, session_id, [earlier])
        await asked_in(conn, tenant, session_id, run_id, ask_entries(run_id), input_at=0)
    first = await start_first(engine, run_id)
    assert first is not None
    async with engine.connect() as conn:
        read = await sessions_db.read_for_run(conn, tenant, session_id, run_id, 2)
    assert first.start == read
    assert first.start.session is not None and first.start.session.rev == 3
    assert [e.seq for e in first.start.written] == [2, 3]
    assert first.start.newest is not None
    assert [e.seq for e in first.start.newest.entries] == [1, 2, 3]


async def test_the_expiry_of_a_waiting_run_leaves_a_busy_session_for_its_next_look(
    engine: AsyncEngine,
) -> None:
    """A run whose client never sent its tool outputs ends failed, which writes its session.
    While an ask holds the session's row (it may go on to lock the run, to steer it), the
    expiry takes neither row and does not wait (it took the run's row, then waited for the
    session's: with the ask waiting for the run, a deadlock); the next look expires it."""
    run = (await start_first(engine, (await queued_run(engine)).id)).run  # type: ignore[union-attr]
    async with engine.begin() as conn:
        expired = {"status": "requires_action", "action_expires_at": text("now() - interval '1s'")}
        await runs_db.update_run(conn, run.id, expired)
    async with holding_session(engine, run.session_id) as ask:
        await never_waiting_for(engine, ask, runs_service.expire_waiting_runs(engine))
        async with engine.connect() as conn:
            still = await runs_db.get_run(conn, run.id)
        assert still is not None and still.status is RunStatus.REQUIRES_ACTION
    await runs_service.expire_waiting_runs(engine)
    async with engine.connect() as conn:
        ended = await runs_db.get_run(conn, run.id)
    assert ended is not None and ended.status is RunStatus.FAILED


async def test_a_run_waiting_for_tool_outputs_is_cancelled_at_once_while_its_job_closes(
    engine: AsyncEngine,
) -> None:
    """The worker that parked a run still holds its job until it returns: a client that
    saw run.requires_action and cancels at once found the job `doing`, left the run to a
    worker that had already let it go, and the run waited until its outputs timed out."""
    run = (await start_first(engine, (await queued_run(engine)).id)).run  # type: ignore[union-attr]
    assert run.job_id is not None
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE procrastinate_jobs SET status = 'doing' WHERE id = :id"),
            {"id": run.job_id},
        )
        calls = [{"tool_call_id": "c1", "name": "pick_color", "arguments": {}}]
        await run_transitions.await_tool_outputs(conn, run, calls, 600)
    cancelled = await runs_service.cancel_run(engine, run.tenant_id, run.id)
    assert cancelled.status is RunStatus.CANCELLED
    assert (await events_of(engine, run))[-1][1] == "run.cancelled"
    async with engine.connect() as conn:
        job = (
            await conn.execute(
                text("SELECT status FROM procrastinate_jobs WHERE id = :id"), {"id": run.job_id}
            )
        ).scalar_one()
    assert job == "doing"  # its worker finishes it, as it would have


async def started(engine: AsyncEngine) -> runs_db.FirstStart:
    first = await start_first(engine, (await queued_run(engine)).id)
    assert first is not None and first.start.session is not None
    return first


async def end_as_read(
    engine: AsyncEngine, first: runs_db.FirstStart, job_id: int | None = None
) -> Run:
    """The run's end as its worker writes it when it knows what its start read: one statement,
    no lock taken first; with `job_id`, its job finished by it too."""
    session, version = first.start.session, first.start.version
    assert session is not None and version is not None
    outcome = Outcome("completed", "done", usage=UsageReport(10, 2))
    async with autocommit(engine) as conn:
        ended = await run_transitions.finish(
            conn, first.run, outcome, [], job_id, session.rev, session_as_read=version
        )
        await conn.commit()
    return ended


async def end_locked(engine: AsyncEngine, run: Run) -> Run:
    outcome = Outcome("completed", "done", usage=UsageReport(10, 2))
    async with engine.begin() as conn:
        found = await runs_db.lock_with_rev(conn, run.id)
        assert found is not None
        locked, rev = found
        return await run_transitions.finish(conn, locked, outcome, [], session_rev=rev)


Stored = tuple[tuple[int, str, int, int], list[tuple[int, str]], list[tuple[int, str]], object]


async def stored_of(engine: AsyncEngine, run: Run) -> Stored:
    """What a run's end wrote, named so that two runs' can be compared."""
    async with engine.connect() as conn:
        session = await sessions_db.get_session(conn, run.tenant_id, run.session_id)
        kinds = (
            await conn.execute(
                text("SELECT seq, kind FROM entries WHERE session_id = :s ORDER BY seq"),
                {"s": run.session_id},
            )
        ).all()
        row = await runs_db.get_run(conn, run.id)
    assert session is not None and row is not None
    events = [(seq, str(kind)) for seq, kind, _ in await events_of(engine, run)]
    totals = (session.rev, session.status.value, session.input_tokens, session.output_tokens)
    entries = [(int(seq), str(kind)) for seq, kind in kinds]
    return totals, entries, events, (row.status, row.end_entry_seq, row.result)


async def test_a_runs_end_as_its_start_read_it_is_one_statement_writing_what_the_locked_end_does(
    settings: Settings,
) -> None:
    async with own_engine(settings) as engine:
        one, two = await started(engine), await started(engine)
        with watching(engine) as seen:
            await end_as_read(engine, one)
        await end_locked(engine, two.run)
        assert seen.in_transaction == [False]  # one statement, in a transaction of its own
        assert await stored_of(engine, one.run) == await stored_of(engine, two.run)
        totals, kinds, events, row = await stored_of(engine, one.run)
        assert totals == (3, "idle", 10, 2)
        assert kinds == [(1, "message"), (2, "usage"), (3, "run_end")]
        assert events[-1] == (len(events), "run.completed")
        assert row == (RunStatus.COMPLETED, 3, "done")


async def ask_meanwhile(engine: AsyncEngine, run: Run) -> None:
    queued = str(uuid.uuid4())
    async with engine.begin() as conn:
        entries = ask_entries(queued, "next")
        await asked_in(conn, run.tenant_id, run.session_id, queued, entries, input_at=0)


async def cancel_meanwhile(engine: AsyncEngine, run: Run) -> None:
    async with engine.begin() as conn:
        await runs_db.update_run(conn, run.id, {"cancel_mode": "cancel"})


async def steer_meanwhile(engine: AsyncEngine, run: Run) -> None:
    async with engine.begin() as conn:
        steer = steers_db.Steer(
            str(uuid.uuid4()), run.tenant_id, run.session_id, run.id, "on", run.model, {}
        )
        await steers_db.insert_steer(conn, steer)


async def webhook_meanwhile(engine: AsyncEngine, run: Run) -> None:
    async with engine.begin() as conn:
        await webhooks_db.insert_endpoint(
            conn, tenant_id=run.tenant_id, url="https://example.com/hook", encrypted_secret="x"
        )


async def retitled_meanwhile(engine: AsyncEngine, run: Run) -> None:
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE sessions SET title = 'renamed' WHERE id = :id"), {"id": run.session_id}
        )


@pytest.mark.parametrize(
    "meanwhile",
    [ask_meanwhile, cancel_meanwhile, steer_meanwhile, webhook_meanwhile, retitled_meanwhile],
)
async def test_a_runs_end_as_its_start_read_it_writes_nothing_once_anything_it_read_changed(
    engine: AsyncEngine, meanwhile: Callable[[AsyncEngine, Run], Awaitable[None]]
) -> None:
    """An ask committed to the session, a cancel, a steer, a webhook endpoint that wants the
    end, any write of the session's row: the one-statement end aborts, and the end under the
    locks (which reads them) writes it."""
    first = await started(engine)
    await meanwhile(engine, first.run)
    before = await stored_of(engine, first.run)
    with pytest.raises(runs_db.Changed):
        await end_as_read(engine, first)
    assert await stored_of(engine, first.run) == before
    ended = await end_locked(engine, first.run)
    assert not ended.active


async def test_a_steer_committed_while_a_runs_end_waits_for_its_rows_is_not_missed(
    engine: AsyncEngine,
) -> None:
    """A steering ask holds the session's row and the run's while it commits its steer. The
    end, waiting for them, reads the steers as they were before the wait: that the steer wrote
    the session's row is what tells it (the steer would be left pending for nobody)."""
    first = await started(engine)
    run = first.run
    async with holding_session(engine, run.session_id) as steering:
        await steering.execute(
            text("SELECT id FROM runs WHERE id = :id FOR UPDATE"), {"id": run.id}
        )
        steer = steers_db.Steer(
            str(uuid.uuid4()), run.tenant_id, run.session_id, run.id, "on", run.model, {}
        )
        await steers_db.insert_steer(steering, steer)
        ending = asyncio.ensure_future(end_as_read(engine, first))
        await waiting_for_a_lock(engine, ending, "WITH end_events AS%")
    with pytest.raises(runs_db.Changed):
        await ending
    ended = await end_locked(engine, run)
    kinds = [kind for _, kind, _ in await events_of(engine, ended)]
    assert "run.steered" in kinds and kinds[-1] == "run.completed"


async def test_a_runs_end_as_its_start_read_it_takes_the_session_then_the_run_then_the_job(
    engine: AsyncEngine,
) -> None:
    """The order every other writer takes them in (an ask that steers or interrupts takes the
    session's row, then the run's; a cancel, then the job's): the end, waiting for the session
    a steering ask holds, holds neither the run's row nor the job's meanwhile (it did hold the
    run's: the ask, going on to lock it, deadlocked with it)."""
    first = await started(engine)
    run = first.run
    assert run.job_id is not None
    async with holding_session(engine, run.session_id) as steering:
        ending = asyncio.ensure_future(end_as_read(engine, first, run.job_id))
        await waiting_for_a_lock(engine, ending, "WITH end_events AS%")
        for row in ("runs", "procrastinate_jobs"):  # free: taken at once, or this fails
            key = run.id if row == "runs" else run.job_id
            nowait = text(f"SELECT id FROM {row} WHERE id = :id FOR UPDATE NOWAIT")
            await steering.execute(nowait, {"id": key})
    ended = await ending  # the session's row was not written meanwhile: as read
    assert ended.status is RunStatus.COMPLETED
    async with engine.connect() as conn:
        job = (
            await conn.execute(
                text("SELECT status FROM procrastinate_jobs WHERE id = :id"), {"id": run.job_id}
            )
        ).scalar_one()
    assert job == "succeeded"
