"""Tool-call ids are unique in a session's thread, whatever ids the upstream sends.

The fake model here behaves like a real one: it calls its tool until it sees that call's result
as the last message, then answers. A call the projection lost is called again, so any id
collision shows as a tool run more than once per ask.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import httpx
import pytest

from testkit.api import history, new_session
from testkit.sse_client import collect
from testkit.upstream import FakeUpstream, ReceivedRequest, Script, Text, ToolCall
from tests.core.format_oracles import validate_anthropic, validate_openai

CALCULATOR = {"name": "calculator", "kind": "builtin"}
ASKS = 20


def tool_user(upstream_id: str | None) -> Any:
    """A model that calls the calculator unless the last message answers its call."""

    def respond(request: ReceivedRequest) -> Script:
        last = request.body["messages"][-1]
        answered = last["role"] == "tool" or (
            isinstance(last["content"], list)
            and any(b.get("type") == "tool_result" for b in last["content"])
        )
        if answered:
            return Script((Text("done"),))
        return Script((ToolCall(upstream_id, "calculator", '{"expression": "1+1"}'),))

    return respond


async def ask_many(api: httpx.AsyncClient, sid: str, count: int) -> list[str]:
    run_ids = []
    for i in range(count):
        events = await collect(api, "POST", f"/v1/sessions/{sid}/ask", json={"input": f"q{i}"})
        assert events[-1].type == "run.completed", events[-1].data
        run_ids.append(events[0].data["run_id"])
    return run_ids


async def assert_each_ran_once(api: httpx.AsyncClient, sid: str, run_ids: list[str]) -> None:
    journal = await history(api, sid)
    calls = Counter(e["refs"]["run_id"] for e in journal if e["kind"] == "tool_call")
    results = Counter(e["refs"]["run_id"] for e in journal if e["kind"] == "tool_result")
    assert {r: calls[r] for r in run_ids} == dict.fromkeys(run_ids, 1)
    assert {r: results[r] for r in run_ids} == dict.fromkeys(run_ids, 1)
    ids = [e["refs"]["tool_call_id"] for e in journal if e["kind"] == "tool_call"]
    assert len(ids) == len(set(ids))  # unique in the thread


def assert_wire_valid(upstream: FakeUpstream) -> None:
    for request in upstream.requests:
        if request.path.endswith("/messages"):
            assert validate_anthropic(request.body) == []
        else:
            assert validate_openai(request.body) == []


@pytest.mark.parametrize(
    ("model", "upstream_id"),
    [
        ("openai:gpt-4o-mini", "call_1"),
        ("anthropic:claude-haiku-4-5", "toolu_01"),
        ("openai:gpt-4o-mini", None),  # servers that send no id at all
    ],
)
async def test_twenty_asks_with_the_same_upstream_id_run_each_tool_once(
    api: httpx.AsyncClient, upstream: FakeUpstream, model: str, upstream_id: str | None
) -> None:
    upstream.respond_with(tool_user(upstream_id))
    sid = (await new_session(api, config={"model": model, "tools": [CALCULATOR]}))["id"]
    run_ids = await ask_many(api, sid, ASKS)
    await assert_each_ran_once(api, sid, run_ids)
    assert len(upstream.requests) == 2 * ASKS  # one call, one answer per ask
    assert_wire_valid(upstream)


async def test_a_forks_new_calls_never_collide_with_its_parents(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    upstream.respond_with(tool_user("call_1"))
    sid = (await new_session(api, config={"tools": [CALCULATOR]}))["id"]
    parent_runs = await ask_many(api, sid, 3)
    fork = await api.post(f"/v1/sessions/{sid}/fork", json={})
    assert fork.status_code == 201, fork.text
    child = fork.json()["id"]
    child_runs = await ask_many(api, child, 5)
    more_parent_runs = await ask_many(api, sid, 2)  # the parent goes on after the fork too
    await assert_each_ran_once(api, child, parent_runs + child_runs)
    await assert_each_ran_once(api, sid, parent_runs + more_parent_runs)
    assert len(upstream.requests) == 2 * (3 + 5 + 2)
    assert_wire_valid(upstream)
