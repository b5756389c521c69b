"""Run policies: limits are checked before an ask where they can be, during a run otherwise,
and a violation is a journal entry plus a clear error."""

from __future__ import annotations

from typing import Any

import httpx

from testkit.api import history, new_session
from testkit.sse_client import collect
from testkit.upstream import FakeUpstream, Text, ToolCall, Usage

CALCULATOR = {"name": "calculator", "kind": "builtin"}


async def session_with(api: httpx.AsyncClient, **policy: Any) -> str:
    return str((await new_session(api, config={"tools": [CALCULATOR], "run_policy": policy}))["id"])


async def ask(api: httpx.AsyncClient, sid: str, **body: Any) -> list:  # type: ignore[type-arg]
    return await collect(api, "POST", f"/v1/sessions/{sid}/ask", json={"input": "go", **body})


async def test_max_turns_refuses_the_ask_before_commit(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = await session_with(api, max_turns=1)
    upstream.script(Text("one"))
    assert (await ask(api, sid))[-1].type == "run.completed"
    before = await history(api, sid)
    refused = await api.post(f"/v1/sessions/{sid}/ask", json={"input": "again"})
    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "policy_violation"
    assert refused.json()["error"]["details"]["rule"] == "max_turns"
    assert await history(api, sid) == before


async def test_max_total_tokens_before_and_during_a_run(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = await session_with(api, max_total_tokens=100)
    upstream.script(ToolCall("c1", "calculator", '{"expression": "1+1"}'), Usage(70, 40))
    events = await ask(api, sid)
    assert events[-1].type == "run.failed"
    assert events[-1].data["error"]["rule"] == "max_total_tokens"
    assert len(upstream.requests) == 1  # stopped before the second model call
    refused = await api.post(f"/v1/sessions/{sid}/ask", json={"input": "more"})
    assert (
        refused.status_code == 409
        and refused.json()["error"]["details"]["rule"] == "max_total_tokens"
    )


async def test_max_run_seconds(api: httpx.AsyncClient, upstream: FakeUpstream) -> None:
    sid = await session_with(api, max_run_seconds=0.5)
    upstream.script(*[Text("s") for _ in range(100)], token_delay=0.02)
    events = await ask(api, sid)
    assert events[-1].type == "run.failed" and events[-1].data["error"]["rule"] == "max_run_seconds"
    journal = await history(api, sid)
    assert any(e["kind"] == "policy_violation" for e in journal)
    answer = next(e for e in journal if e["payload"].get("role") == "assistant")
    assert answer["payload"]["status"] == "incomplete"


async def test_a_denied_tool_gets_an_error_result_and_the_run_continues(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = await session_with(api, tools_deny=["calculator"])
    upstream.script(ToolCall("c1", "calculator", '{"expression": "6*7"}'))
    upstream.script(Text("I may not calculate."))
    events = await ask(api, sid)
    assert events[-1].type == "run.completed"
    result = next(e for e in await history(api, sid) if e["kind"] == "tool_result")
    assert result["payload"]["is_error"] and "does not allow" in result["payload"]["content"]


async def test_a_denied_tool_can_stop_the_run(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = await session_with(api, tools_allow=["current_time"], on_denied="stop")
    upstream.script(ToolCall("c1", "calculator", '{"expression": "6*7"}'))
    events = await ask(api, sid)
    assert events[-1].type == "run.failed" and events[-1].data["error"]["rule"] == "tool_denied"


async def test_an_ask_overrides_the_session_policy(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = await session_with(api, max_iterations=5)
    upstream.script(ToolCall("c1", "calculator", '{"expression": "1"}'))
    upstream.script(ToolCall("c2", "calculator", '{"expression": "2"}'))
    events = await ask(api, sid, run_policy={"max_iterations": 1})
    assert events[-1].data["error"]["rule"] == "max_iterations"
    assert len(upstream.requests) == 1
