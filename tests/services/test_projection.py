"""Projection through the database: a fork projects exactly like the same thread unforked."""

from __future__ import annotations

import uuid
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.ext.asyncio import AsyncEngine

from app.config import Settings
from app.core.entries import EntryKind, NewEntry
from app.core.formats import to_anthropic, to_openai
from app.db import runs as runs_db
from app.db import sessions as sessions_db
from app.db.engine import read_snapshot
from app.services.errors import Invalid
from app.services.journal import append_entries
from app.services.keys import create_key, tenant_for_key
from app.services.projection import project_run_from, project_run_in, project_session
from app.services.sessions import create_session, fork_session
from tests.core.format_oracles import validate_anthropic, validate_openai
from tests.db.test_runs import created, run_values


@st.composite
def threads(draw: st.DrawFn) -> list[NewEntry]:
    entries: list[NewEntry] = []
    for turn in range(draw(st.integers(1, 8))):
        entries.append(
            NewEntry(
                EntryKind.MESSAGE,
                {"role": "user", "content": f"q{turn} " * draw(st.integers(1, 40))},
                {},
            )
        )
        if draw(st.booleans()):
            call = f"t{turn}"
            entries.append(
                NewEntry(
                    EntryKind.TOOL_CALL,
                    {"name": "f", "arguments": {"n": turn}},
                    {"tool_call_id": call, "call_id": f"c{turn}"},
                )
            )
            if draw(st.booleans()):
                entries.append(
                    NewEntry(
                        EntryKind.TOOL_RESULT,
                        {"content": "r " * draw(st.integers(1, 200))},
                        {"tool_call_id": call},
                    )
                )
        entries.append(
            NewEntry(EntryKind.MESSAGE, {"role": "assistant", "content": f"a{turn}"}, {})
        )
    return entries


async def _new(engine: AsyncEngine, tenant_id: str, entries: list[NewEntry]) -> str:
    config = {"model": "openai:gpt-4o"}
    sid = (await create_session(engine, tenant_id, title=None, metadata={}, config=config)).id
    if entries:
        await append_entries(engine, tenant_id, sid, entries, expected_rev=None)
    return sid


@settings(max_examples=15, suppress_health_check=list(HealthCheck))
@given(thread=threads(), data=st.data())
async def test_a_fork_projects_like_the_same_thread_unforked(
    engine: AsyncEngine, settings: Settings, thread: list[NewEntry], data: st.DataObject
) -> None:
    tenant_id = await tenant_for_key(engine, await create_key(engine, f"p-{uuid.uuid4()}"))
    assert tenant_id is not None
    at = data.draw(st.integers(0, len(thread)))
    parent = await _new(engine, tenant_id, thread[:at])
    divergent = NewEntry(EntryKind.MESSAGE, {"role": "user", "content": "parent only"}, {})
    await append_entries(engine, tenant_id, parent, [divergent], expected_rev=None)
    child = (await fork_session(engine, tenant_id, parent, at_seq=at, title=None, metadata=None)).id
    if thread[at:]:
        await append_entries(engine, tenant_id, child, thread[at:], expected_rev=None)
    reference = await _new(engine, tenant_id, thread)

    roomy: dict[str, Any] = {"max_input_tokens": 100_000}
    forked = await project_session(engine, settings, tenant_id, child, policy=roomy)
    plain = await project_session(engine, settings, tenant_id, reference, policy=roomy)
    assert forked.projection.messages == plain.projection.messages
    assert forked.projection.meta == plain.projection.meta

    try:
        tight = await project_session(
            engine, settings, tenant_id, child, policy={"max_input_tokens": 900}
        )
    except Invalid as refused:  # the newest turn alone may not fit 675 tokens: a clear refusal
        assert refused.code == "context_overflow"
        return
    p = tight.projection
    assert p.meta.estimated_tokens <= 900 - 225
    assert validate_openai(to_openai(p.messages, p.tool_spec)) == []
    assert validate_anthropic(to_anthropic(p.messages, p.tool_spec)) == []


@settings(max_examples=15, suppress_health_check=list(HealthCheck))
@given(thread=threads(), budget=st.sampled_from([None, 300, 900, 5000]))
async def test_a_run_projected_from_its_starts_one_read_is_projected_as_in_a_snapshot(
    engine: AsyncEngine, settings: Settings, thread: list[NewEntry], budget: int | None
) -> None:
    """A starting run projects from the newest entries its start read with the session (one
    statement) when they reach back far enough; that projection is the one read in a
    snapshot, message for message."""
    tenant_id = await tenant_for_key(engine, await create_key(engine, f"p-{uuid.uuid4()}"))
    assert tenant_id is not None
    sid = await _new(engine, tenant_id, thread * 6)  # some threads longer than the entries read
    policy = {"max_input_tokens": budget} if budget else None
    values = run_values(tenant_id, sid) | {"params": {"context_policy": policy}}
    async with engine.begin() as conn:
        run = (await runs_db.insert_queued_run(conn, created(values), **values)).run
    async with read_snapshot(engine) as conn:
        start = await sessions_db.read_for_run(conn, tenant_id, sid, run.id, run.input_seq)
        assert start.session is not None and start.newest is not None
        try:
            in_snapshot: object = await project_run_in(conn, settings, start.session, run)
        except Invalid as refused:
            in_snapshot = refused.code
    try:
        from_start: object = await project_run_from(settings, start.session, run, start.newest)
    except Invalid as refused:
        from_start = refused.code
    if len(thread) * 6 < sessions_db.NEWEST_ENTRIES:  # it read the whole thread
        assert from_start is not None
    if from_start is not None:
        assert from_start == in_snapshot
