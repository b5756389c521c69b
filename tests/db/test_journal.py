"""The projection loader reads only the tail a budget can use, whatever the thread's length;
what the journal keeps byte for byte, and what it cannot."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from app.core.content import unstorable
from app.core.entries import EntryKind, JournalEntry, NewEntry
from app.core.policy import ContextPolicy
from app.core.projection import tail_suffices
from app.db.journal import FIRST_PAGE, read_tail, run_entries, tail_from
from app.db.sessions import get_session, read_for_run
from app.services.errors import Invalid
from app.services.journal import append_entries
from app.services.keys import create_key, tenant_for_key
from app.services.sessions import create_session


def note(i: int) -> NewEntry:
    role = "user" if i % 2 == 0 else "assistant"
    return NewEntry(EntryKind.MESSAGE, {"role": role, "content": f"message {i} " + "w " * 30}, {})


async def tenant(engine: AsyncEngine) -> str:
    found = await tenant_for_key(engine, await create_key(engine, f"t-{uuid.uuid4()}"))
    assert found is not None
    return found


async def long_session(engine: AsyncEngine, tenant_id: str, entries: int) -> str:
    sid = (await create_session(engine, tenant_id, title=None, metadata={}, config={})).id
    for start in range(0, entries, 1000):
        batch = [note(i) for i in range(start, min(start + 1000, entries))]
        await append_entries(engine, tenant_id, sid, batch, expected_rev=None)
    return sid


async def tail(
    engine: AsyncEngine, tenant_id: str, sid: str, policy: ContextPolicy
) -> tuple[list[JournalEntry], bool]:
    def suffices(tail: list[JournalEntry]) -> bool:
        return tail_suffices(tail, policy, recount=False)

    async with engine.connect() as conn:
        session = await get_session(conn, tenant_id, sid)
        assert session is not None
        return await read_tail(conn, session.thread, suffices)


async def test_the_tail_read_does_not_grow_with_the_thread(engine: AsyncEngine) -> None:
    tenant_id = await tenant(engine)
    policy = ContextPolicy(max_input_tokens=2000, reserve_output_tokens=500)
    sizes = {}
    for entries in (300, 3000):
        sid = await long_session(engine, tenant_id, entries)
        rows, complete = await tail(engine, tenant_id, sid, policy)
        assert not complete and rows[-1].seq == entries
        assert [r.seq for r in rows] == list(range(entries - len(rows) + 1, entries + 1))
        sizes[entries] = len(rows)
    assert sizes[300] == sizes[3000] < 300


async def test_the_tail_read_stops_at_the_checkpoint(engine: AsyncEngine) -> None:
    tenant_id = await tenant(engine)
    sid = await long_session(engine, tenant_id, 2000)
    summary = NewEntry(EntryKind.SUMMARY, {"from_seq": 1, "to_seq": 1990, "content": "s"}, {})
    await append_entries(engine, tenant_id, sid, [summary, note(0)], expected_rev=None)
    rows, complete = await tail(engine, tenant_id, sid, ContextPolicy(max_input_tokens=1_000_000))
    assert not complete
    assert rows[0].seq <= 1991 and len(rows) < 300  # the checkpoint, plus at most a page


async def test_short_threads_are_read_whole(engine: AsyncEngine) -> None:
    tenant_id = await tenant(engine)
    sid = await long_session(engine, tenant_id, 10)
    rows, complete = await tail(engine, tenant_id, sid, ContextPolicy())
    assert complete and len(rows) == 10


async def test_a_runs_entries_are_read_by_its_sessions_tenant_only(engine: AsyncEngine) -> None:
    owner, other = await tenant(engine), await tenant(engine)
    sid = str((await create_session(engine, owner, title=None, metadata={}, config={})).id)
    run_id = str(uuid.uuid4())
    said = {"role": "assistant", "content": "an answer"}
    answer = NewEntry(EntryKind.MESSAGE, said, {"run_id": run_id})
    await append_entries(engine, owner, sid, [answer], expected_rev=None)
    async with engine.connect() as conn:
        mine = await run_entries(conn, sid, 1, run_id, tenant_id=owner)
        assert [e.payload["content"] for e in mine] == ["an answer"]
        assert await run_entries(conn, sid, 1, run_id, tenant_id=other) == []


# Any code point, NUL and lone surrogates (high or low) included, and a few of each kind.
THINKING_TEXT = st.text(
    alphabet=st.one_of(
        st.characters(codec=None, categories=None),
        st.sampled_from(["\x00", "\ud800", "\udfff", "\U0001f914", "\t", "\n", " "]),
    ),
    max_size=24,
)


@given(thinking=THINKING_TEXT)
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
async def test_thinking_round_trips_byte_for_byte_or_is_known_unstorable(
    engine: AsyncEngine, thinking: str
) -> None:
    """`unstorable` is exactly what the journal refuses (its entry checks, or Postgres): any
    other thinking text comes back as it went in, byte for byte; refused text leaves nothing
    written."""
    tenant_id = await tenant(engine)
    sid = (await create_session(engine, tenant_id, title=None, metadata={}, config={})).id
    part = {"type": "thinking", "thinking": thinking, "signature": "c2lnbmVk"}
    answer = {"role": "assistant", "content": [part, {"type": "text", "text": "ok"}]}
    entry = NewEntry(EntryKind.MESSAGE, answer, {})
    if unstorable(part) is None:
        await append_entries(engine, tenant_id, sid, [entry], expected_rev=None)
        async with engine.connect() as conn:
            session = await get_session(conn, tenant_id, sid)
            assert session is not None and session.rev == 1
            stored = (await read_tail(conn, session.thread, lambda _: False))[0]
        assert stored[-1].payload["content"][0]["thinking"].encode() == thinking.encode()
    else:
        with pytest.raises((Invalid, DBAPIError, UnicodeEncodeError)):
            await append_entries(engine, tenant_id, sid, [entry], expected_rev=None)
        async with engine.connect() as conn:
            session = await get_session(conn, tenant_id, sid)
        assert session is not None and session.rev == 0


async def test_the_newest_entries_read_with_the_session_serve_the_tail_as_read_tail_does(
    engine: AsyncEngine,
) -> None:
    """A run's start reads the thread's newest entries with its session (one statement) and
    projects from them when they reach back far enough: then the tail is read_tail's, entry
    for entry, whatever the thread's length around the page sizes and whatever the budget."""
    tenant_id = await tenant(engine)
    served = 0
    for entries in (1, 63, 64, 65, 127, 128, 129, 200):
        sid = await long_session(engine, tenant_id, entries)
        async with engine.connect() as conn:
            start = await read_for_run(conn, tenant_id, sid, str(uuid.uuid4()), 1)
        assert start.newest is not None
        for wanted in (0, 10, 63, 64, 65, 100, 10_000):
            # Enough once the tail holds `wanted` entries (0: at once; 10 000: never).
            def suffices(tail: list[JournalEntry], wanted: int = wanted) -> bool:
                return len(tail) >= wanted

            from_newest = await tail_from(start.newest, suffices)
            async with engine.connect() as conn:
                session = await get_session(conn, tenant_id, sid)
                assert session is not None
                read = await read_tail(conn, session.thread, suffices)
            if entries <= 2 * FIRST_PAGE:  # read whole, and known to be whole
                assert from_newest is not None, (entries, wanted)
            if from_newest is not None:
                served += 1
                assert from_newest == read, (entries, wanted)
            else:  # it would read past them: only when they may not hold the whole thread
                assert not start.newest.reaches_start, (entries, wanted)
    assert served > 30  # most of these threads are served without a second read
