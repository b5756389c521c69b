"""Memory through the services and the database: projections carry the named memory,
byte-stable while it is unchanged, through compaction, and the memory tools are offered."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from app.config import Settings
from app.core.builtin_tools import with_builtin_schema
from app.core.entries import EntryKind, NewEntry, PendingEntry
from app.core.memory import MEMORY_LINES, MEMORY_TOOLS
from app.core.sessions import SessionConfig
from app.services import memory as memory_service
from app.services.errors import PreconditionFailed
from app.services.journal import append_entries
from app.services.keys import create_key, tenant_for_key
from app.services.projection import offered_tools, project_session
from app.services.sessions import create_session, delete_session

NOTES = "".join(f"- fact {i}\n" for i in range(MEMORY_LINES + 20))


async def _tenant(engine: AsyncEngine) -> str:
    tenant_id = await tenant_for_key(engine, await create_key(engine, f"m-{uuid.uuid4()}"))
    assert tenant_id is not None
    return tenant_id


async def _session(engine: AsyncEngine, tenant_id: str, **config: object) -> str:
    session = await create_session(
        engine,
        tenant_id,
        title=None,
        metadata={},
        config={"model": "openai:gpt-4o", **config},
    )
    return session.id


def _user(text: str) -> NewEntry:
    return NewEntry(EntryKind.MESSAGE, {"role": "user", "content": text}, {})


async def test_projections_carry_the_memory_byte_stable(
    engine: AsyncEngine, settings: Settings
) -> None:
    tenant = await _tenant(engine)
    await memory_service.put_memory(engine, tenant, "agent:x", NOTES)
    sid = await _session(engine, tenant, system_prompt="Be brief.", memory_namespace="agent:x")
    await append_entries(engine, tenant, sid, [_user("hello")], expected_rev=None)

    def ask(text: str) -> list[PendingEntry]:
        return [PendingEntry("message", {"role": "user", "content": text})]

    first = await project_session(engine, settings, tenant, sid, pending=ask("one"))
    system = first.projection.messages[0]
    assert isinstance(system.content, str)
    assert system.content.startswith("Be brief.\n\n# Memory (agent:x)\n```\n- fact 0\n")
    assert f"- fact {MEMORY_LINES - 1}\n```\n[20 more lines" in system.content
    assert first.projection.meta.memory_tokens > 0

    await append_entries(
        engine,
        tenant,
        sid,
        [NewEntry(EntryKind.MESSAGE, {"role": "assistant", "content": "hi"}, {}), _user("two")],
        expected_rev=None,
    )
    second = await project_session(engine, settings, tenant, sid, pending=ask("three"))
    assert second.projection.messages[0] == system  # same bytes: the prefix stays cacheable
    assert second.projection.meta.memory_tokens == first.projection.meta.memory_tokens

    # A summary checkpoint drops history, never the memory.
    summary = {"from_seq": 1, "to_seq": 3, "content": "They greeted.", "model": "m"}
    await append_entries(
        engine, tenant, sid, [NewEntry(EntryKind.SUMMARY, summary, {})], expected_rev=None
    )
    compacted = await project_session(engine, settings, tenant, sid, pending=ask("four"))
    assert compacted.projection.meta.summary_used
    assert compacted.projection.messages[0] == system

    # A policy prompt replaces the session's prompt; the memory stays.
    overridden = await project_session(
        engine, settings, tenant, sid, pending=ask("five"), policy={"system_prompt": "Other."}
    )
    assert (
        overridden.projection.messages[0].content
        == "Other.\n\n" + str(system.content)[len("Be brief.\n\n") :]
    )

    # A write changes what the next projection carries.
    await memory_service.update_memory(engine, tenant, "agent:x", "- fact 0\n", "- fact zero\n")
    changed = await project_session(engine, settings, tenant, sid, pending=ask("six"))
    assert "- fact zero\n" in str(changed.projection.messages[0].content)


async def test_memory_is_per_tenant_and_outlives_sessions(
    engine: AsyncEngine, settings: Settings
) -> None:
    owner, other = await _tenant(engine), await _tenant(engine)
    await memory_service.put_memory(engine, owner, "shared", "- owner's secret")
    sid = await _session(engine, other, memory_namespace="shared")
    await append_entries(engine, other, sid, [_user("hi")], expected_rev=None)
    projected = await project_session(engine, settings, other, sid)
    assert [m.role for m in projected.projection.messages] == ["user"]  # nothing of the owner's
    assert projected.projection.meta.memory_tokens == 0

    mine = await _session(engine, owner, memory_namespace="shared")
    await delete_session(engine, owner, mine)
    kept = await memory_service.get_memory(engine, owner, "shared")
    assert kept.content == "- owner's secret"


def test_etag_is_the_version_and_the_creation_time() -> None:
    created = datetime(2024, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    memory = memory_service.Memory("n", "", 3, created, created + timedelta(hours=1))
    tag = memory.etag
    assert tag.startswith('"v3-') and tag.endswith('"')
    generation = tag[len('"v3-') : -1]
    # Microseconds since the epoch in base 36, exactly: it names this incarnation.
    assert generation == generation.lower() and int(generation, 36) == 1_704_164_645_678_901
    # Not the update time: every version of one memory shares the generation.
    later = memory_service.Memory("n", "x", 4, created, created + timedelta(days=9))
    assert later.etag == f'"v4-{generation}"'
    # A row (a list item) gives the same ETag as the memory; another instant, another one.
    row = {"version": 3, "created_at": created}
    assert memory_service.etag(row) == tag
    other = memory_service.Memory("n", "", 3, created + timedelta(microseconds=1), created)
    assert other.etag != tag
    # Another time zone, the same instant: the same ETag.
    shifted = created.astimezone(timezone(timedelta(hours=5, minutes=30)))
    assert memory_service.Memory("n", "", 3, shifted, shifted).etag == tag


async def test_a_recreated_memory_gets_a_new_etag(engine: AsyncEngine) -> None:
    tenant = await _tenant(engine)
    first = (await memory_service.put_memory(engine, tenant, "again", "one")).memory
    assert (await memory_service.get_memory(engine, tenant, "again")).etag == first.etag
    [listed] = (await memory_service.list_memories(engine, tenant, limit=10)).items
    assert memory_service.etag(listed) == first.etag
    await memory_service.delete_memory(engine, tenant, "again", if_match=first.etag)

    second = await memory_service.put_memory(engine, tenant, "again", "two")
    assert second.created and second.memory.version == 1
    assert second.memory.etag != first.etag
    for write in (
        memory_service.put_memory(engine, tenant, "again", "x", if_match=first.etag),
        memory_service.update_memory(engine, tenant, "again", "two", "x", if_match=first.etag),
        memory_service.delete_memory(engine, tenant, "again", if_match=first.etag),
    ):
        with pytest.raises(PreconditionFailed) as failed:
            await write
        assert failed.value.details == {
            "namespace": "again",
            "etag": second.memory.etag,
            "version": 1,
        }
    assert (await memory_service.get_memory(engine, tenant, "again")).content == "two"
    await memory_service.delete_memory(engine, tenant, "again", if_match=second.memory.etag)


def test_memory_tools_are_offered_with_a_namespace_only() -> None:
    names = [t["name"] for t in offered_tools(SessionConfig(), [])]
    assert names == []
    with_memory = offered_tools(SessionConfig(memory_namespace="n"), [])
    assert [t["name"] for t in with_memory] == ["read_memory", "write_memory", "update_memory"]
    assert all(t["kind"] == "builtin" for t in with_memory)
    # The session's and the ask's definitions of the same name win, in that order.
    mine = {"name": "read_memory", "kind": "client", "description": "mine"}
    asked = {"name": "write_memory", "kind": "webhook", "url": "http://x"}
    extra = {"name": "calculator", "kind": "builtin"}
    merged = {
        t["name"]: t
        for t in offered_tools(SessionConfig(memory_namespace="n", tools=[mine, extra]), [asked])
    }
    assert merged["read_memory"] is mine and merged["write_memory"] is asked
    # Built-ins reach the model with their own schema, whoever declared them.
    assert merged["update_memory"] == MEMORY_TOOLS[2]
    assert merged["calculator"] == with_builtin_schema(extra) != extra
    assert [t["name"] for t in offered_tools(SessionConfig(tools=[extra]), [asked])] == [
        "calculator",
        "write_memory",
    ]
