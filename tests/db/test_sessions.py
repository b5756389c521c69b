"""What a starting run reads of its session in one statement is what three reads give."""

from __future__ import annotations

import uuid

from sqlalchemy.ext.asyncio import AsyncEngine

from app.core.entries import EntryKind, NewEntry
from app.core.lineage import Segment
from app.db import runs as runs_db
from app.db import sessions as sessions_db
from app.db.engine import read_snapshot
from app.db.journal import journal_entry, read_entries, run_entries
from app.services.journal import append_entries
from app.services.sessions import fork_session
from tests.db.test_runs import created, new_session, run_values


def entry(content: object, refs: dict[str, object]) -> NewEntry:
    return NewEntry(EntryKind.MESSAGE, {"role": "user", "content": content}, refs)


async def test_a_runs_start_read_is_the_session_its_compactions_and_its_entries(
    engine: AsyncEngine,
) -> None:
    tenant, session = await new_session(engine)
    run_id, other = str(uuid.uuid4()), str(uuid.uuid4())
    rich = [{"type": "text", "text": "ünï 먼射 \U0001f600"}, {"type": "text", "text": '"q"\n'}]
    await append_entries(
        engine,
        tenant,
        session,
        [
            entry("before the run", {"run_id": run_id}),  # before its input: not its own
            entry("its input", {"run_id": run_id}),
            entry("another run's", {"run_id": other}),
            entry(rich, {"run_id": run_id, "tool_call_id": "c1"}),
        ],
        expected_rev=None,
    )

    async def both() -> tuple[sessions_db.RunStart, tuple[object, bool, object]]:
        async with read_snapshot(engine) as conn:
            one = await sessions_db.read_for_run(conn, tenant, session, run_id, 2)
            row = await sessions_db.get_session(conn, tenant, session, include_expired=True)
            compacting = await runs_db.active_runs(
                conn, session, kind="compaction", tenant_id=tenant
            )
            written = await run_entries(conn, session, 2, run_id, tenant_id=tenant)
        return one, (row, bool(compacting), written)

    one, three = await both()
    assert (one.session, one.compacting, one.written) == three
    assert [e.seq for e in one.written] == [2, 4]
    assert one.written[1].payload["content"] == rich

    values = run_values(tenant, session) | {"kind": "compaction"}
    async with engine.begin() as conn:
        await runs_db.insert_queued_run(conn, created(values), **values)
    one, three = await both()
    assert one.compacting and (one.session, one.compacting, one.written) == three

    async with read_snapshot(engine) as conn:
        elsewhere = await sessions_db.read_for_run(conn, str(uuid.uuid4()), session, run_id, 2)
    assert (elsewhere.session, elsewhere.compacting, elsewhere.written) == (None, False, [])


async def test_a_runs_start_read_has_the_threads_newest_entries_when_it_is_all_its_own(
    engine: AsyncEngine,
) -> None:
    tenant, session = await new_session(engine)
    run_id = str(uuid.uuid4())
    texts = [f"turn {n}" for n in range(sessions_db.NEWEST_ENTRIES + 5)]
    await append_entries(
        engine, tenant, session, [entry(t, {"run_id": run_id}) for t in texts], expected_rev=None
    )
    async with read_snapshot(engine) as conn:
        start = await sessions_db.read_for_run(conn, tenant, session, run_id, 1)
        page = await read_entries(
            conn, [Segment(session, 0, None)], descending=True, limit=sessions_db.NEWEST_ENTRIES
        )
        without = await sessions_db.read_for_run(
            conn, tenant, session, run_id, 1, with_newest=False
        )
    assert start.newest is not None and not start.newest.reaches_start
    assert start.newest.entries == [journal_entry(r) for r in reversed(page)]
    assert without.newest is None and (without.session, without.written) == (
        start.session,
        start.written,
    )

    forked = await fork_session(engine, tenant, session, at_seq=3, title=None, metadata=None)
    async with read_snapshot(engine) as conn:
        fork = await sessions_db.read_for_run(conn, tenant, forked.id, run_id, 1)
    assert fork.session is not None and fork.newest is None  # its thread is its parent's too
