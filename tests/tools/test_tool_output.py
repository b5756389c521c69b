"""read_tool_output against the real journal: pages give back the exact output, across forks,
and only from the caller's own thread."""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from app.core.entries import EntryKind, NewEntry
from app.core.eviction import page, preview
from app.core.messages import canonical_json
from app.core.tool_loop import PendingCall
from app.services.journal import append_entries
from app.services.keys import create_key, tenant_for_key
from app.services.sessions import create_session, fork_session
from app.tools.registry import BUILTINS, ToolContext, ToolOutcome, builtin, execute
from testkit.api import history, new_session
from testkit.sse_client import collect
from testkit.upstream import FakeUpstream, Text, ToolCall

# About 110,000 characters (more bytes): emoji, CJK, accents, CRLF, a trailing newline.
OUTPUT = "".join(f"{i:05d} résumé 🗾 東京の天気 — ok\r\n{'x' * (i % 40)}\n" for i in range(2_400))


async def tenant(engine: AsyncEngine) -> str:
    found = await tenant_for_key(engine, await create_key(engine, f"t-{uuid.uuid4()}"))
    assert found is not None
    return found


async def session(engine: AsyncEngine, tenant_id: str) -> str:
    return (await create_session(engine, tenant_id, title=None, metadata={}, config={})).id


async def tool_turn(
    engine: AsyncEngine, tenant_id: str, sid: str, call_id: str, output: Any
) -> tuple[int, int]:
    """(seq of the user message, seq of the tool result)."""
    refs = {"tool_call_id": call_id, "call_id": f"turn-{call_id}"}
    appended = await append_entries(
        engine,
        tenant_id,
        sid,
        [
            NewEntry(EntryKind.MESSAGE, {"role": "user", "content": "fetch it"}, {}),
            NewEntry(EntryKind.TOOL_CALL, {"name": "fetch", "arguments": {}}, refs),
            NewEntry(EntryKind.TOOL_RESULT, {"name": "fetch", "content": output}, refs),
        ],
        expected_rev=None,
    )
    seqs = [int(e["seq"]) for e in appended.entries]
    return seqs[0], seqs[2]


async def read(
    engine: AsyncEngine,
    tenant_id: str,
    sid: str,
    tools: list[dict[str, Any]] | None = None,
    **a: Any,
) -> ToolOutcome:
    context = ToolContext(tenant_id, sid, "run", "call", engine)
    return await execute(PendingCall("call", "read_tool_output", a, 1), tools or [], context)


async def read_all(engine: AsyncEngine, tenant_id: str, sid: str, ref: str, limit: int) -> str:
    parts, offset = [], 0
    while offset is not None:
        outcome = await read(engine, tenant_id, sid, ref=ref, offset=offset, limit=limit)
        assert not outcome.is_error, outcome.content
        page = outcome.content
        assert page["ref"] == ref and page["offset"] == offset and page["limit"] == limit
        parts.append(page["content"])
        offset = page["next_offset"]
    return "".join(parts)


def test_it_is_registered_by_importing_the_tools() -> None:
    assert "read_tool_output" in BUILTINS


@pytest.mark.parametrize("limit", [7_777, 20_000, 100_000])
async def test_pages_join_to_the_exact_output(engine: AsyncEngine, limit: int) -> None:
    tenant_id = await tenant(engine)
    sid = await session(engine, tenant_id)
    _, seq = await tool_turn(engine, tenant_id, sid, "c1", OUTPUT)
    assert len(OUTPUT) > 100_000
    joined = await read_all(engine, tenant_id, sid, f"tool_output:{seq}", limit)
    assert joined.encode("utf-8") == OUTPUT.encode("utf-8")


async def test_structured_outputs_page_as_their_json_text(engine: AsyncEngine) -> None:
    tenant_id = await tenant(engine)
    sid = await session(engine, tenant_id)
    output = {"rows": [{"id": i, "name": f"東京 {i}"} for i in range(3000)]}
    _, seq = await tool_turn(engine, tenant_id, sid, "c1", output)
    joined = await read_all(engine, tenant_id, sid, f"tool_output:{seq}", 20_000)
    assert joined == canonical_json(output)


async def test_the_first_page_by_default_and_the_end_is_empty(engine: AsyncEngine) -> None:
    tenant_id = await tenant(engine)
    sid = await session(engine, tenant_id)
    _, seq = await tool_turn(engine, tenant_id, sid, "c1", OUTPUT)
    first = (await read(engine, tenant_id, sid, ref=f"tool_output:{seq}")).content
    assert first["content"] == OUTPUT[:20_000] and first["next_offset"] == 20_000
    assert first["total_chars"] == len(OUTPUT)
    past = (await read(engine, tenant_id, sid, ref=f"tool_output:{seq}", offset=10**9)).content
    assert past["content"] == "" and past["next_offset"] is None


async def test_a_fork_reads_its_parents_outputs_up_to_the_fork(engine: AsyncEngine) -> None:
    tenant_id = await tenant(engine)
    parent = await session(engine, tenant_id)
    _, seq = await tool_turn(engine, tenant_id, parent, "c1", OUTPUT)
    child = (
        await fork_session(engine, tenant_id, parent, at_seq=seq, title=None, metadata=None)
    ).id
    grandchild = (
        await fork_session(engine, tenant_id, child, at_seq=None, title=None, metadata=None)
    ).id
    for sid in (child, grandchild):
        assert await read_all(engine, tenant_id, sid, f"tool_output:{seq}", 50_000) == OUTPUT
    # What the parent wrote after the fork is not the child's: its seqs are the child's own.
    _, later = await tool_turn(engine, tenant_id, parent, "c2", "parent only")
    outcome = await read(engine, tenant_id, child, ref=f"tool_output:{later}")
    assert outcome.is_error and "no entry" in outcome.content


async def test_errors_the_model_can_read(engine: AsyncEngine) -> None:
    tenant_id = await tenant(engine)
    sid = await session(engine, tenant_id)
    user_seq, seq = await tool_turn(engine, tenant_id, sid, "c1", OUTPUT)
    cases = {
        f"tool_output:{user_seq}": "is a message entry, not a tool output",
        f"tool_output:{seq + 1}": "there is no entry tool_output:",
        "tool_output:999999": "there is no entry",
        "57": "is not a tool output reference",
        "": "is not a tool output reference",
    }
    for ref, message in cases.items():
        outcome = await read(engine, tenant_id, sid, ref=ref)
        assert outcome.is_error and message in outcome.content, (ref, outcome.content)
        assert outcome.content.startswith("Error: read_tool_output failed: ")
    good = f"tool_output:{seq}"
    for arguments, message in (
        ({"offset": -1}, "offset must be >= 0"),
        ({"limit": 0}, "limit must be from 1 to 100000"),
        ({"limit": 100_001}, "limit must be from 1 to 100000"),
        ({"offset": "ten"}, "offset must be an integer"),
        ({"offset": 1.5}, "offset must be an integer"),
        ({"limit": True}, "limit must be an integer"),
    ):
        outcome = await read(engine, tenant_id, sid, ref=good, **arguments)
        assert outcome.is_error and message in outcome.content, (arguments, outcome.content)
    lenient = await read(engine, tenant_id, sid, ref=good, offset="5", limit=10.0)
    assert not lenient.is_error and lenient.content["content"] == OUTPUT[5:15]


async def test_other_tenants_and_sessions_cannot_read_it(engine: AsyncEngine) -> None:
    tenant_id = await tenant(engine)
    sid = await session(engine, tenant_id)
    _, seq = await tool_turn(engine, tenant_id, sid, "c1", OUTPUT)
    ref = f"tool_output:{seq}"
    stranger = await tenant(engine)
    outcome = await read(engine, stranger, sid, ref=ref)
    assert outcome.is_error and "this session was not found" in outcome.content
    sibling = await session(engine, tenant_id)
    outcome = await read(engine, tenant_id, sibling, ref=ref)
    assert outcome.is_error and "no entry" in outcome.content
    assert not (await read(engine, tenant_id, sid, ref=ref)).is_error


async def test_a_declared_definition_of_the_name_wins(engine: AsyncEngine) -> None:
    tenant_id = await tenant(engine)
    sid = await session(engine, tenant_id)
    _, seq = await tool_turn(engine, tenant_id, sid, "c1", "short")
    declared = [{"name": "read_tool_output", "kind": "client"}]
    outcome = await read(engine, tenant_id, sid, declared, ref=f"tool_output:{seq}")
    assert outcome.is_error and "client tools are not available" in outcome.content
    builtin = [{"name": "read_tool_output", "kind": "builtin"}]
    outcome = await read(engine, tenant_id, sid, builtin, ref=f"tool_output:{seq}")
    assert not outcome.is_error and outcome.content["content"] == "short"


async def test_an_evicted_output_is_previewed_and_paged_back_through_the_service(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    """A built-in returns ~114,000 characters (about 41,000 tokens, over the default threshold of
    20,000): the next model request holds its preview and read_tool_output, which the run never
    declared; the model reads a page and the request after holds exactly that page."""

    @builtin("big_report")
    async def big_report(arguments: dict[str, Any], context: ToolContext) -> str:
        return OUTPUT

    try:
        tools = [{"name": "big_report", "kind": "builtin", "description": "The full report"}]
        sid = (await new_session(api, config={"tools": tools}))["id"]
        # Seqs: 1 the question, 2 run_start, 3 the call, 4 its result.
        read_arguments = {"ref": "tool_output:4", "offset": 100, "limit": 30_000}
        upstream.script(ToolCall("call_big", "big_report", "{}"))
        upstream.script(ToolCall("call_read", "read_tool_output", json.dumps(read_arguments)))
        upstream.script(Text("Read it."))
        events = await collect(
            api, "POST", f"/v1/sessions/{sid}/ask", json={"input": "Get the report."}
        )
    finally:
        del BUILTINS["big_report"]
    assert events[-1].type == "run.completed", events[-1].data
    journal = await history(api, sid)
    assert journal[3]["kind"] == "tool_result" and journal[3]["seq"] == 4
    assert journal[3]["payload"]["content"] == OUTPUT  # the journal keeps it whole

    first, second, third = (r.body for r in upstream.requests[-3:])
    assert [t["function"]["name"] for t in first["tools"]] == ["big_report"]
    shown = preview(OUTPUT, "tool_output:4")
    assert second["messages"][-1] == {
        "role": "tool",
        "tool_call_id": "call_1_1_0",
        "content": shown,
    }
    assert [t["function"]["name"] for t in second["tools"]] == ["big_report", "read_tool_output"]
    expected = page(OUTPUT, "tool_output:4", 100, 30_000)
    assert third["messages"][-3]["content"] == shown  # still a preview
    assert third["messages"][-1] == {
        "role": "tool",
        "tool_call_id": "call_1_2_0",
        "content": canonical_json(expected),
    }
    assert json.loads(third["messages"][-1]["content"])["content"] == OUTPUT[100:30_100]
    assert journal[-3]["kind"] == "message" and journal[-3]["payload"]["content"] == "Read it."
