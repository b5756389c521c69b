"""An answer cut off by the output limit is marked as such: in its journal entry, the run's
result and the terminal event, in provider-neutral words, through both SDKs."""

from __future__ import annotations

import httpx
import pytest

from testkit.api import history, new_session
from testkit.sse_client import collect
from testkit.upstream import FakeUpstream, Text, ToolCall

OPENAI, ANTHROPIC = "openai:gpt-4o-mini", "anthropic:claude-haiku-4-5"


@pytest.mark.parametrize(
    ("model", "said", "neutral"),
    [
        (OPENAI, "length", "length"),
        (ANTHROPIC, "max_tokens", "length"),
        (OPENAI, None, "stop"),  # the upstream's normal stop: "stop"
        (ANTHROPIC, None, "stop"),  # "end_turn"
        (OPENAI, "content_filter", "content_filter"),
        (ANTHROPIC, "refusal", "content_filter"),
    ],
)
async def test_the_finish_reason_is_journaled_reported_and_streamed(
    api: httpx.AsyncClient, upstream: FakeUpstream, model: str, said: str | None, neutral: str
) -> None:
    sid = (await new_session(api, config={"model": model}))["id"]
    upstream.script(Text("The three longest rivers are the Nile, the"), stop_reason=said)
    body = {"input": "Name the three longest rivers.", "max_output_tokens": 10}
    events = await collect(api, "POST", f"/v1/sessions/{sid}/ask", json=body)
    terminal = events[-1]
    assert terminal.type == "run.completed"
    assert terminal.data["finish_reason"] == neutral
    run = (await api.get(f"/v1/runs/{terminal.data['run_id']}")).json()
    assert (run["status"], run["finish_reason"]) == ("completed", neutral)
    answer = next(e for e in await history(api, sid) if e["payload"].get("role") == "assistant")
    assert answer["payload"]["finish_reason"] == neutral
    assert answer["payload"]["content"] == "The three longest rivers are the Nile, the"


async def test_a_tool_turns_text_says_it_stopped_for_the_calls(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    tools = [{"name": "calculator", "kind": "builtin"}]
    sid = (await new_session(api, config={"model": ANTHROPIC, "tools": tools}))["id"]
    upstream.script(Text("Computing."), ToolCall("toolu_1", "calculator", '{"expression": "6*7"}'))
    upstream.script(Text("42"))
    events = await collect(api, "POST", f"/v1/sessions/{sid}/ask", json={"input": "6 times 7?"})
    assert events[-1].data["finish_reason"] == "stop"
    said = [
        (e["payload"]["content"], e["payload"].get("finish_reason"))
        for e in await history(api, sid)
        if e["payload"].get("role") == "assistant"
    ]
    assert said == [("Computing.", "tool_calls"), ("42", "stop")]


async def test_a_run_that_did_not_complete_has_no_finish_reason(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = (await new_session(api))["id"]
    upstream.script(Text("partial"), ToolCall("c1", "teleport", "{"))  # then the limit
    body = {"input": "go", "run_policy": {"max_iterations": 1}}
    events = await collect(api, "POST", f"/v1/sessions/{sid}/ask", json=body)
    assert events[-1].type == "run.failed" and "finish_reason" not in events[-1].data
    run = (await api.get(f"/v1/runs/{events[-1].data['run_id']}")).json()
    assert run["finish_reason"] is None
