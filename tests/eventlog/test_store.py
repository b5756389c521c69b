"""Run events outlive their run only for the retention period; the journal stays."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import asyncpg
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.engine import libpq_url
from app.eventlog import store as event_store
from app.services.keys import create_key, tenant_for_key
from app.services.sessions import create_session


async def run_with_events(engine: AsyncEngine, ended_ago: str | None) -> str:
    tenant = await tenant_for_key(engine, await create_key(engine, f"ev-{uuid.uuid4()}"))
    assert tenant is not None
    session = await create_session(engine, tenant, title=None, metadata={}, config={})
    run_id = str(uuid.uuid4())
    async with engine.begin() as conn:
        ended = f"now() - interval '{ended_ago}'" if ended_ago else "NULL"
        await conn.execute(
            text(
                "INSERT INTO runs (id, tenant_id, session_id, model, status, ended_at)"
                f" VALUES (:id, :tenant, :session, 'openai:x', 'completed', {ended})"
            ),
            {"id": run_id, "tenant": tenant, "session": session["id"]},
        )
        await event_store.append_events(
            conn, [(run_id, "message.delta", {"text": "x"}) for _ in (1, 2)]
        )
    return run_id


async def test_prune_drops_only_events_of_runs_ended_before_the_retention(
    engine: AsyncEngine,
) -> None:
    old = await run_with_events(engine, "2 hours")
    recent = await run_with_events(engine, "10 minutes")
    running = await run_with_events(engine, None)
    async with engine.begin() as conn:
        pruned = await event_store.prune(conn, 3600)
    assert old in pruned.run_ids and pruned.events >= 2
    assert recent not in pruned.run_ids and running not in pruned.run_ids
    async with engine.connect() as conn:
        assert await event_store.last_seq(conn, old) == 0
        assert await event_store.last_seq(conn, recent) == 2
        assert await event_store.last_seq(conn, running) == 2


async def test_a_run_is_pruned_once_and_a_prune_takes_the_oldest_first(
    engine: AsyncEngine,
) -> None:
    # Every prune (each minute) used to delete by every run that ever ended: its cost grew
    # with the service's whole history. Now a pruned run is marked and never looked at again.
    async with engine.begin() as conn:
        await event_store.prune(conn, 0)  # what earlier tests left
    older = await run_with_events(engine, "3 hours")
    old = await run_with_events(engine, "2 hours")
    async with engine.begin() as conn:
        first = await event_store.prune(conn, 3600, limit=1)
        second = await event_store.prune(conn, 3600, limit=1)
        third = await event_store.prune(conn, 3600, limit=1)
    assert (first.run_ids, first.events) == ([older], 2)
    assert (second.run_ids, second.events) == ([old], 2)
    assert (third.run_ids, third.events) == ([], 0)
    async with engine.connect() as conn:
        query = "SELECT count(*) FROM runs WHERE id = ANY(CAST(:ids AS uuid[])) AND events_pruned"
        assert (await conn.execute(text(query), {"ids": [older, old]})).scalar_one() == 2


async def test_append_allocates_dense_seqs_per_run_in_order(engine: AsyncEngine) -> None:
    """One batch holding several runs' events, then more batches: each run's seqs continue
    after its highest, in the order given, whichever batch they came in."""
    a = await run_with_events(engine, None)  # seqs 1, 2 already
    b = await run_with_events(engine, None)
    batch: list[tuple[str, str, dict[str, Any]]] = [
        (a, "message.delta", {"text": "a3"}),
        (b, "usage", {"n": 1}),
    ]
    batch += [(a, "message.delta", {"text": "a4"}), (b, "run.completed", {"n": 2})]
    async with engine.begin() as conn:
        assert await event_store.append_events(conn, batch) == {a: 4, b: 4}
    async with engine.begin() as conn:
        assert await event_store.append_events(conn, [(a, "usage", {})]) == {a: 5}
        assert await event_store.append_events(conn, []) == {}
    async with engine.connect() as conn:
        rows = (await event_store.read_backlog(conn, a, 0)).rows
        other = (await event_store.read_backlog(conn, b, 0)).rows
    assert [(r["seq"], r["type"]) for r in rows][2:] == [
        (3, "message.delta"),
        (4, "message.delta"),
        (5, "usage"),
    ]
    assert [r["data"].get("text") for r in rows][2:4] == ["a3", "a4"]
    assert [(r["seq"], r["type"], r["data"]) for r in other][2:] == [
        (3, "usage", {"n": 1}),
        (4, "run.completed", {"n": 2}),
    ]


async def test_rows_numbered_in_memory_are_the_rows_the_table_holds(engine: AsyncEngine) -> None:
    """What a worker hands its own process's followers (numbered) is exactly what any other
    process reads from the table: the same seqs, types and data, keys in jsonb's order, so
    that a live event and its replay serialize to the same bytes."""
    first = await run_with_events(engine, None)
    second = await run_with_events(engine, None)
    data: list[dict[str, Any]] = [
        {"text": "a"},
        {"zz": 1, "a": [{"bb": 2, "a": None}], "é": "x", "ab": {"c": True, "b": 1.5}},
        {"tool_call_id": "call_1", "index": 0, "arguments": "{", "name": "f"},
        {"text": "b", "text2": "c"},
    ]
    events = [(first, "message.delta", data[0]), (second, "tool_call.delta", data[2])]
    events += [(first, "message.delta", data[1]), (first, "message.delta", data[3])]
    async with engine.begin() as conn:
        last = await event_store.append_events(conn, events)
        stored = await event_store.read_events_of_runs(conn, {first: 2, second: 2})
    numbered = event_store.numbered(events, last)
    as_read = [{**dict(row), "run_id": str(row["run_id"])} for row in stored]

    def key(row: dict[str, Any]) -> tuple[str, int]:
        return (str(row["run_id"]), int(row["seq"]))

    assert sorted(numbered, key=key) == sorted(as_read, key=key)
    for row in as_read:
        (mine,) = [r for r in numbered if key(r) == key(row)]
        assert json.dumps(mine["data"]) == json.dumps(row["data"])  # the same key order


def test_a_fenced_run_is_numbered_nothing() -> None:
    events = [("a", "message.delta", {"text": "x"}), ("b", "message.delta", {"text": "y"})]
    assert event_store.numbered(events, {"a": 7}) == [
        {"run_id": "a", "seq": 7, "type": "message.delta", "data": {"text": "x"}}
    ]


async def test_an_append_announces_each_runs_last_seq_when_it_commits(
    engine: AsyncEngine, database_url: str
) -> None:
    """The INSERT carries its own NOTIFY: every run written, up to its last seq, once the
    transaction commits; nothing for a batch the fence dropped whole; "look at everything"
    when the payload would be too long for a notification."""
    a = await run_with_events(engine, None)  # seqs 1, 2 already
    b = await run_with_events(engine, None)
    heard: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    listener = await asyncpg.connect(libpq_url(database_url))
    await listener.add_listener(
        event_store.CHANNEL, lambda *args: heard.put_nowait(json.loads(args[-1]))
    )
    try:
        async with engine.begin() as conn:
            batch = [(a, "message.delta", {"text": "x"}), (b, "usage", {}), (a, "usage", {})]
            assert await event_store.append_events(conn, batch) == {a: 4, b: 3}
            assert heard.empty()  # not before the commit
        assert await asyncio.wait_for(heard.get(), 30) == {"runs": {a: 4, b: 3}}

        async with engine.begin() as conn:  # a's attempt is not 99: fenced, nothing written
            assert await event_store.append_events(conn, [(a, "usage", {})], {a: 99}) == {}
            many: list[tuple[str, str, dict[str, Any]]] = [
                (str(uuid.uuid4()), "usage", {}) for _ in range(200)
            ]
            await conn.execute(
                text(
                    "INSERT INTO runs (id, tenant_id, session_id, model, status)"
                    " SELECT r, tenant_id, session_id, model, 'running' FROM runs,"
                    " unnest(CAST(:ids AS uuid[])) AS r WHERE id = :a"
                ),
                {"ids": [run for run, _, _ in many], "a": a},
            )
            assert len(await event_store.append_events(conn, many)) == 200
        assert await asyncio.wait_for(heard.get(), 30) == {"all": True}
        assert heard.empty()  # the fenced append told nobody anything
    finally:
        await listener.close()


async def test_a_runs_events_are_read_by_its_tenant_only(engine: AsyncEngine) -> None:
    run_id = await run_with_events(engine, None)
    other = await tenant_for_key(engine, await create_key(engine, f"ev-{uuid.uuid4()}"))
    assert other is not None
    async with engine.connect() as conn:
        owner = str(
            await conn.scalar(text("SELECT tenant_id FROM runs WHERE id = :id"), {"id": run_id})
        )
        mine = await event_store.read_events(conn, run_id, 0, tenant_id=owner)
        assert [r["seq"] for r in mine] == [1, 2]
        assert await event_store.read_events(conn, run_id, 0, tenant_id=other) == []
