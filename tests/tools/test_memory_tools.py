"""The memory built-ins against the real database: the session's namespace, PATCH's rules,
errors the model can read."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from app.core.memory import MEMORY_TOOLS
from app.core.tool_loop import PendingCall
from app.services import memory as memory_service
from app.services.keys import create_key, tenant_for_key
from app.services.sessions import create_session, update_session
from app.tools.registry import BUILTINS, ToolContext, ToolOutcome, execute


async def _context(engine: AsyncEngine, **config: Any) -> ToolContext:
    tenant_id = await tenant_for_key(engine, await create_key(engine, f"t-{uuid.uuid4()}"))
    assert tenant_id is not None
    session = await create_session(engine, tenant_id, title=None, metadata={}, config=config)
    return ToolContext(tenant_id, session.id, "run", "call", engine)


async def call(context: ToolContext, name: str, **arguments: Any) -> ToolOutcome:
    return await execute(PendingCall("call", name, arguments, 1), MEMORY_TOOLS, context)


def test_the_three_are_registered_and_described() -> None:
    assert {"read_memory", "write_memory", "update_memory"} <= set(BUILTINS)
    for tool in MEMORY_TOOLS:
        assert tool["kind"] == "builtin" and tool["description"]
        assert tool["parameters"]["type"] == "object"
    write = next(t for t in MEMORY_TOOLS if t["name"] == "write_memory")
    assert write["parameters"]["required"] == ["content"]


async def test_write_read_update(engine: AsyncEngine) -> None:
    context = await _context(engine, memory_namespace="agent:tools")
    empty = await call(context, "read_memory")
    assert (empty.content, empty.is_error) == ("Memory agent:tools is empty.", False)

    written = await call(context, "write_memory", content="- likes tea\n- lives in Oslo\n")
    assert not written.is_error
    assert written.content == "Memory agent:tools saved: version 1, 2 lines."
    read = await call(context, "read_memory")
    assert read.content == (
        "Memory agent:tools (version 1, 2 lines):\n- likes tea\n- lives in Oslo\n"
    )

    updated = await call(context, "update_memory", old_string="tea", new_string="coffee")
    assert updated.content == "Memory agent:tools updated: 1 replacement, now version 2, 2 lines."
    stored = await memory_service.get_memory(engine, context.tenant_id, "agent:tools")
    assert stored.content == "- likes coffee\n- lives in Oslo\n"

    # The rules of PATCH, as errors the model can read; nothing is written.
    missing = await call(context, "update_memory", old_string="Paris", new_string="Rome")
    assert missing.is_error and "not found" in missing.content
    ambiguous = await call(context, "update_memory", old_string="- l", new_string="* l")
    assert ambiguous.is_error and "occurs 2 times" in ambiguous.content
    every = await call(
        context, "update_memory", old_string="- l", new_string="* l", replace_all=True
    )
    assert "2 replacements, now version 3" in every.content
    too_big = await call(context, "write_memory", content="x" * (256 * 1024 + 1))
    assert too_big.is_error and "at most 262144 bytes" in too_big.content
    bad = await call(context, "write_memory")
    assert bad.is_error and "content must be a string" in bad.content
    final = await memory_service.get_memory(engine, context.tenant_id, "agent:tools")
    assert (final.content, final.version) == ("* likes coffee\n* lives in Oslo\n", 3)


async def test_concurrent_updates_serialize(engine: AsyncEngine) -> None:
    context = await _context(engine, memory_namespace="n")
    await call(context, "write_memory", content="end")
    outcomes = await asyncio.gather(
        *(call(context, "update_memory", old_string="end", new_string="+end") for _ in range(8))
    )
    assert not any(o.is_error for o in outcomes)
    stored = await memory_service.get_memory(engine, context.tenant_id, "n")
    assert (stored.content, stored.version) == ("+" * 8 + "end", 9)


async def test_a_session_without_a_namespace_has_no_memory(engine: AsyncEngine) -> None:
    context = await _context(engine)
    for name, arguments in (
        ("read_memory", {}),
        ("write_memory", {"content": "x"}),
        ("update_memory", {"old_string": "a", "new_string": "b"}),
    ):
        outcome = await call(context, name, **arguments)
        assert outcome.is_error, name
        assert "names no memory_namespace" in outcome.content
    no_db = await call(ToolContext("t", "s", "r", "c"), "read_memory")
    assert no_db.is_error and "needs the database" in no_db.content


async def test_update_before_any_write_says_so(engine: AsyncEngine) -> None:
    context = await _context(engine, memory_namespace="blank")
    outcome = await call(context, "update_memory", old_string="a", new_string="b")
    assert outcome.is_error and "use write_memory first" in outcome.content


async def test_the_namespace_is_read_at_each_call(engine: AsyncEngine) -> None:
    context = await _context(engine, memory_namespace="first")
    await call(context, "write_memory", content="in first")
    await update_session(
        engine, context.tenant_id, context.session_id, {"config": {"memory_namespace": "second"}}
    )
    assert (await call(context, "read_memory")).content == "Memory second is empty."
    await call(context, "write_memory", content="in second")
    first = await memory_service.get_memory(engine, context.tenant_id, "first")
    assert first.content == "in first"
