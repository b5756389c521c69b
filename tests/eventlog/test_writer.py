"""The worker's event writer against a real Postgres: each tick's events in one statement that
also notifies, in order and exactly once, fenced per attempt, and flushes that arrive together
sharing one commit."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import Callable, Collection, Iterator
from typing import Any

import asyncpg
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.engine import libpq_url
from app.eventlog import store as event_store
from app.eventlog.registry import EventType
from app.eventlog.writer import EventWriter
from app.services.keys import create_key, tenant_for_key
from app.services.sessions import create_session

DELTA = EventType.MESSAGE_DELTA
# Only bounds a broken test: every wait here ends as soon as its condition holds.
DEADLINE_SECONDS = 30


class Followers:
    """This process's followers, as the writer hands them rows (app/eventlog/hub.py)."""

    def __init__(self, publish: Callable[[list[dict[str, Any]]], None]) -> None:
        self.publish = publish
        self.committed_runs: list[list[str]] = []  # per commit, the runs it wrote
        self.expected: list[dict[str, Any]] = []

    @contextlib.contextmanager
    def committing(self, run_ids: Collection[str]) -> Iterator[None]:
        self.committed_runs.append(sorted(run_ids))
        yield

    def expect(self, first: dict[str, Any]) -> None:
        self.expected.append(first)


async def running_runs(
    engine: AsyncEngine, count: int, attempts: int = 1, status: str = "running"
) -> list[str]:
    tenant = await tenant_for_key(engine, await create_key(engine, f"wr-{uuid.uuid4()}"))
    assert tenant is not None
    session = await create_session(engine, tenant, title=None, metadata={}, config={})
    ids = [str(uuid.uuid4()) for _ in range(count)]
    async with engine.begin() as conn:
        for run_id in ids:
            await conn.execute(
                text(
                    "INSERT INTO runs (id, tenant_id, session_id, model, status, attempts)"
                    " VALUES (:id, :tenant, :session, 'openai:x', :status, :attempts)"
                ),
                {
                    "id": run_id,
                    "tenant": tenant,
                    "session": session.id,
                    "attempts": attempts,
                    "status": status,
                },
            )
    return ids


async def stored(engine: AsyncEngine, run_id: str) -> list[tuple[int, str, dict[str, Any]]]:
    async with engine.connect() as conn:
        rows = (await event_store.read_backlog(conn, run_id, 0)).rows
    return [(r["seq"], r["type"], r["data"]) for r in rows]


async def test_a_flush_writes_each_runs_events_in_order_and_hands_out_the_same_rows(
    engine: AsyncEngine,
) -> None:
    """Deltas queued in one tick are coalesced; other events keep their place; the rows handed
    to this process's followers are the rows the table holds."""
    a, b = await running_runs(engine, 2)
    handed: list[dict[str, Any]] = []
    followers = Followers(handed.extend)
    writer = EventWriter(engine, followers=followers)
    writer.open(a, 1)
    writer.open(b, 1)
    writer.emit(a, DELTA, {"text": "he"})
    writer.emit(b, EventType.MESSAGE_RESET, {"reason": "retry", "attempt": 1})
    writer.emit(a, DELTA, {"text": "llo"})
    writer.emit(a, EventType.USAGE, {"input_tokens": 1})
    writer.emit(a, DELTA, {"text": "!"})
    await writer.flush()
    writer.emit(a, DELTA, {"text": " more"})
    await writer.flush()
    assert await stored(engine, a) == [
        (1, "message.delta", {"text": "hello"}),
        (2, "usage", {"input_tokens": 1}),
        (3, "message.delta", {"text": "!"}),
        (4, "message.delta", {"text": " more"}),
    ]
    assert await stored(engine, b) == [(1, "message.reset", {"reason": "retry", "attempt": 1})]
    from_table = [(a, *row) for row in await stored(engine, a)]
    from_table += [(b, *row) for row in await stored(engine, b)]
    assert sorted((r["run_id"], r["seq"], r["type"], r["data"]) for r in handed) == sorted(
        from_table
    )
    assert followers.committed_runs == [sorted([a, b]), [a]]  # each commit told its runs


async def test_a_flush_notifies_the_runs_it_wrote_with_their_last_seqs(
    engine: AsyncEngine, database_url: str
) -> None:
    """The NOTIFY rides in the flush's one statement: other processes hear of every commit."""
    a, b = await running_runs(engine, 2)
    heard: asyncio.Queue[str] = asyncio.Queue()
    listener = await asyncpg.connect(libpq_url(database_url))
    try:
        await listener.add_listener(
            event_store.CHANNEL, lambda _c, _p, _ch, payload: heard.put_nowait(payload)
        )
        writer = EventWriter(engine)
        writer.open(a, 1)
        writer.open(b, 1)
        for word in ("x", "y"):
            writer.emit(a, EventType.USAGE, {"word": word})
        writer.emit(b, DELTA, {"text": "z"})
        await writer.flush()
        while True:  # other tests' runs may be notified on the same channel meanwhile
            message = json.loads(await asyncio.wait_for(heard.get(), DEADLINE_SECONDS))
            if a in message.get("runs", {}) or message.get("all"):
                break
    finally:
        await listener.close()
    assert message == {"runs": {a: 2, b: 1}}


async def test_a_notification_too_large_for_postgres_says_look_at_everything(
    engine: AsyncEngine, database_url: str
) -> None:
    runs = await running_runs(engine, 200)  # ~48 bytes each in the payload: past its limit
    heard: asyncio.Queue[str] = asyncio.Queue()
    listener = await asyncpg.connect(libpq_url(database_url))
    try:
        await listener.add_listener(
            event_store.CHANNEL, lambda _c, _p, _ch, payload: heard.put_nowait(payload)
        )
        writer = EventWriter(engine)
        for run_id in runs:
            writer.open(run_id, 1)
            writer.emit(run_id, DELTA, {"text": "t"})
        await writer.flush()
        while True:
            message = json.loads(await asyncio.wait_for(heard.get(), DEADLINE_SECONDS))
            if message.get("all") or runs[0] in message.get("runs", {}):
                break
    finally:
        await listener.close()
    assert message == {"all": True}
    assert [await stored(engine, run_id) for run_id in runs[:3]] == [
        [(1, "message.delta", {"text": "t"})]
    ] * 3


async def test_the_events_of_a_superseded_attempt_are_dropped_and_the_run_marked(
    engine: AsyncEngine,
) -> None:
    mine, taken_over = await running_runs(engine, 2, attempts=2)
    handed: list[dict[str, Any]] = []
    writer = EventWriter(engine, followers=Followers(handed.extend))
    writer.open(mine, 2)
    writer.open(taken_over, 1)  # another worker has started attempt 2 since
    writer.emit(mine, DELTA, {"text": "kept"})
    writer.emit(taken_over, DELTA, {"text": "dropped"})
    await writer.flush()
    assert await stored(engine, mine) == [(1, "message.delta", {"text": "kept"})]
    assert await stored(engine, taken_over) == []
    assert writer.superseded == {taken_over}
    assert [(r["run_id"], r["seq"]) for r in handed] == [(mine, 1)]


async def test_flushes_waiting_together_share_one_commit(engine: AsyncEngine) -> None:
    """Runs that end while a flush is committing each flush their last events: they all wait
    for the next commit, and share it, even while other runs keep emitting (before, each took
    a commit of its own, one after the other: the last waited for all the others)."""
    streaming, *ending = await running_runs(engine, 11)
    commits: list[list[dict[str, Any]]] = []

    def committed(rows: list[dict[str, Any]]) -> None:
        commits.append(rows)
        writer.emit(streaming, DELTA, {"text": "."})  # a run still streaming: more pending

    writer = EventWriter(engine, followers=Followers(committed))
    for run_id in (streaming, *ending):
        writer.open(run_id, 1)

    async def end(run_id: str) -> None:
        writer.emit(run_id, EventType.RUN_COMPLETED, {"status": "completed"})
        await writer.flush()
        assert await stored(engine, run_id) == [(1, "run.completed", {"status": "completed"})]

    await asyncio.wait_for(asyncio.gather(*(end(r) for r in ending)), DEADLINE_SECONDS)
    # The first run's flush, then one for the ten that came while it was committing.
    assert len(commits) == 2
    assert sorted(r["run_id"] for rows in commits for r in rows if r["run_id"] != streaming) == (
        sorted(ending)
    )


async def test_a_failed_flush_keeps_its_events_in_front(engine: AsyncEngine) -> None:
    """A batch that cannot be written (here: data the database refuses) is put back in front,
    in order: the flush raises, nothing is half written, and what is emitted later is never
    written ahead of it."""
    (run_id,) = await running_runs(engine, 1)
    writer = EventWriter(engine)
    writer.open(run_id, 1)
    writer.emit(run_id, DELTA, {"text": "ok"})
    writer.emit(run_id, EventType.USAGE, {"text": "\x00 is not allowed in jsonb"})
    for later in ("a", "b"):
        try:
            await writer.flush()
        except Exception as exc:
            assert "unsupported Unicode escape sequence" in str(exc)
        else:
            raise AssertionError("the database accepted a NUL in jsonb")
        writer.emit(run_id, DELTA, {"text": later})
    assert await stored(engine, run_id) == []


async def test_reasoning_deltas_coalesce_within_a_block_never_across_its_boundaries(
    engine: AsyncEngine,
) -> None:
    [run] = await running_runs(engine, 1)
    writer = EventWriter(engine)
    writer.open(run, 1)
    reasoning = EventType.REASONING_DELTA
    writer.emit(run, reasoning, {"index": 0, "text": "Let ", "start": True})
    writer.emit(run, reasoning, {"index": 0, "text": "me "})
    writer.emit(run, reasoning, {"index": 0, "text": "", "end": True})
    writer.emit(
        run, reasoning, {"index": 1, "text": "", "start": True, "end": True, "redacted": True}
    )
    writer.emit(run, reasoning, {"index": 2, "text": "So", "start": True})
    writer.emit(run, DELTA, {"text": "Hi"})
    writer.emit(run, reasoning, {"index": 2, "text": "!"})
    await writer.flush()

    assert await stored(engine, run) == [
        (1, "reasoning.delta", {"index": 0, "text": "Let me ", "start": True, "end": True}),
        (
            2,
            "reasoning.delta",
            {"index": 1, "text": "", "start": True, "end": True, "redacted": True},
        ),
        (3, "reasoning.delta", {"index": 2, "text": "So", "start": True}),
        (4, "message.delta", {"text": "Hi"}),
        (5, "reasoning.delta", {"index": 2, "text": "!"}),
    ]
