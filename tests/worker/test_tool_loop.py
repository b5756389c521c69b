"""A tool-using agent end to end: the model calls a tool, gets its result, answers."""

from __future__ import annotations

import httpx

from testkit.api import history, new_session
from testkit.sse_client import collect
from testkit.upstream import FakeUpstream, Text, ToolCall, Usage

CALCULATOR = {
    "name": "calculator",
    "kind": "builtin",
    "description": "Arithmetic",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
}


async def test_weather_style_agent_flow(api: httpx.AsyncClient, upstream: FakeUpstream) -> None:
    sid = (await new_session(api, config={"tools": [CALCULATOR]}))["id"]
    upstream.script(
        Text("Let me compute."),
        ToolCall("call_1", "calculator", '{"expression": "4 * 3"}'),
        Usage(30, 10),
    )
    upstream.script(Text("The result is 12"), Usage(50, 5))
    events = await collect(
        api, "POST", f"/v1/sessions/{sid}/ask", json={"input": "Multiply 4 by 3"}
    )
    types = [e.type for e in events]
    assert types[-1] == "run.completed" and events[-1].data["text"] == "The result is 12"
    call = next(e for e in events if e.type == "tool_call")
    assert call.data == {
        "tool_call_id": "call_1_1_0",  # the service's own: the user entry's seq, turn, place
        "name": "calculator",
        "arguments": {"expression": "4 * 3"},
    }
    assert next(e for e in events if e.type == "tool_result").data["preview"] == "12"
    streamed = [e.data for e in events if e.type == "tool_call.delta"]
    assert streamed[0]["name"] == "calculator" and streamed[0]["tool_call_id"] == "call_1_1_0"
    assert "".join(d["arguments"] for d in streamed) == '{"expression": "4 * 3"}'
    assert events[-1].data["usage"]["input_tokens"] == 80  # summed over both model turns

    journal = await history(api, sid)
    run_id = events[0].data["run_id"]
    assert [(e["kind"], e["payload"].get("role")) for e in journal] == [
        ("message", "user"),
        ("run_start", None),
        ("message", "assistant"),
        ("tool_call", None),
        ("tool_result", None),
        ("message", "assistant"),
        ("usage", None),
        ("run_end", None),
    ]
    tool_call, tool_result = journal[3], journal[4]
    assert tool_call["payload"] == {"name": "calculator", "arguments": {"expression": "4 * 3"}}
    assert tool_call["refs"] == {
        "run_id": run_id,
        "call_id": f"{run_id}:1",
        "tool_call_id": "call_1_1_0",
        "upstream_tool_call_id": "call_1",
        "iteration": 1,
        "context_from": 1,  # the oldest entry in the context the call was made from
    }
    assert (
        tool_result["refs"]["tool_call_id"] == "call_1_1_0"
        and tool_result["payload"]["content"] == 12
    )
    assert journal[2]["refs"]["call_id"] == tool_call["refs"]["call_id"]  # text and calls: one turn
    assert journal[5]["refs"] == {"run_id": run_id, "context_from": 1}  # the answer

    second = upstream.requests[1].body
    assert upstream.requests[0].body["tools"][0]["function"]["name"] == "calculator"
    assert [m["role"] for m in second["messages"]] == ["user", "assistant", "tool"]
    assert second["messages"][1]["tool_calls"][0]["id"] == "call_1_1_0"
    assert second["messages"][2] == {"role": "tool", "tool_call_id": "call_1_1_0", "content": "12"}


async def test_unknown_tools_and_bad_arguments_become_error_results(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = (await new_session(api, config={"tools": [CALCULATOR]}))["id"]
    upstream.script(ToolCall("c1", "teleport", "{}"), ToolCall("c2", "calculator", "{oops"))
    upstream.script(Text("Sorry."))
    events = await collect(api, "POST", f"/v1/sessions/{sid}/ask", json={"input": "go"})
    assert events[-1].type == "run.completed"
    results = [e for e in await history(api, sid) if e["kind"] == "tool_result"]
    assert all(r["payload"]["is_error"] for r in results) and len(results) == 2
    sent = upstream.requests[1].body["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "tool", "tool"]
    # Every result has its tool_result event, the one answered with the turn's calls too.
    reported = {e.data["tool_call_id"]: e.data for e in events if e.type == "tool_result"}
    assert set(reported) == {r["refs"]["tool_call_id"] for r in results}
    assert all(data["is_error"] for data in reported.values())


async def test_the_iteration_limit_ends_the_run_with_a_policy_violation(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = (await new_session(api, config={"tools": [CALCULATOR]}))["id"]
    for i in range(10):
        upstream.script(ToolCall(f"c{i}", "calculator", '{"expression": "1+1"}'))
    events = await collect(api, "POST", f"/v1/sessions/{sid}/ask", json={"input": "loop forever"})
    assert events[-1].type == "run.failed"
    assert events[-1].data["error"]["code"] == "policy_violation"
    assert events[-1].data["error"]["rule"] == "max_iterations"
    journal = await history(api, sid)
    assert [e["kind"] for e in journal].count("tool_call") == 10
    assert any(e["kind"] == "policy_violation" for e in journal)


async def test_tools_attached_to_one_ask(api: httpx.AsyncClient, upstream: FakeUpstream) -> None:
    sid = (await new_session(api))["id"]  # the session itself offers no tools
    upstream.script(ToolCall("c1", "calculator", '{"expression": "5*5"}'))
    upstream.script(Text("25"))
    body = {"input": "5 squared?", "tools": [CALCULATOR]}
    events = await collect(api, "POST", f"/v1/sessions/{sid}/ask", json=body)
    assert events[-1].type == "run.completed"
    assert upstream.requests[0].body["tools"][0]["function"]["name"] == "calculator"
    result = next(e for e in await history(api, sid) if e["kind"] == "tool_result")
    assert result["payload"]["content"] == 25 and not result["payload"]["is_error"]
    upstream.script(Text("no tools now"))
    await collect(api, "POST", f"/v1/sessions/{sid}/ask", json={"input": "next"})
    assert "tools" not in upstream.requests[-1].body  # they were for that ask only


async def test_search_history_tool_finds_what_was_said(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    search_tool = {"name": "search_history", "kind": "builtin", "description": "Search the history"}
    sid = (await new_session(api, config={"tools": [search_tool]}))["id"]
    upstream.script(Text("Noted."))
    await collect(
        api, "POST", f"/v1/sessions/{sid}/ask", json={"input": "My locker number is 5150."}
    )
    upstream.script(ToolCall("s1", "search_history", '{"query": "locker"}'))
    upstream.script(Text("It is 5150."))
    events = await collect(
        api, "POST", f"/v1/sessions/{sid}/ask", json={"input": "What was my locker?"}
    )
    assert events[-1].type == "run.completed"
    result = next(e for e in reversed(await history(api, sid)) if e["kind"] == "tool_result")
    assert not result["payload"]["is_error"]
    hits = {hit["seq"]: hit["excerpt"] for hit in result["payload"]["content"]}
    assert "5150" in hits[1]  # the first ask's words; the question itself matches too
