"""Client-side tools: the run pauses for the client's outputs, resumes with them, or expires."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from testkit.api import history, new_session
from testkit.sse_client import collect
from testkit.upstream import FakeUpstream, Text, ToolCall

LOCATE = {"name": "get_location", "kind": "client", "description": "Where the user is"}
CALCULATOR = {"name": "calculator", "kind": "builtin"}
LOC, CALC = "call_1_1_0", "call_1_1_1"  # the calls of a new session's first ask, as journaled


async def waiting_run(api: httpx.AsyncClient, upstream: FakeUpstream) -> tuple[str, str, Any]:
    sid = (await new_session(api, config={"tools": [LOCATE, CALCULATOR]}))["id"]
    upstream.script(
        ToolCall("call_loc", "get_location", "{}"),
        ToolCall("call_calc", "calculator", '{"expression": "2+2"}'),
    )
    run = (
        await api.post(f"/v1/sessions/{sid}/ask", json={"input": "where am I?", "stream": False})
    ).json()
    events = await collect(api, "GET", f"/v1/runs/{run['id']}/events", until="run.requires_action")
    return sid, run["id"], events


async def test_requires_action_then_outputs_then_completed(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid, run_id, events = await waiting_run(api, upstream)
    action = next(e for e in events if e.type == "run.requires_action")
    # The service's own ids (the user entry's seq, model turn, place); the built-in ran.
    assert [c["tool_call_id"] for c in action.data["tool_calls"]] == [LOC]
    assert (await api.get(f"/v1/runs/{run_id}")).json()["status"] == "requires_action"

    unknown = await api.post(
        f"/v1/runs/{run_id}/tool_outputs",
        json={"tool_outputs": [{"tool_call_id": "nope", "output": 1}]},
    )
    assert unknown.status_code == 422
    assert unknown.json()["error"]["details"]["missing"] == [LOC]
    assert unknown.json()["error"]["details"]["unknown"] == ["nope"]

    upstream.script(Text("You are in Oslo."))
    body = {"tool_outputs": [{"tool_call_id": LOC, "output": {"city": "Oslo"}}]}
    resumed = await api.post(f"/v1/runs/{run_id}/tool_outputs", json=body)
    assert resumed.status_code == 200 and resumed.json()["status"] == "queued"
    done = (await api.get(f"/v1/runs/{run_id}", params={"wait": "true", "timeout": 20})).json()
    assert done["status"] == "completed" and done["result"] == "You are in Oslo."
    again = await api.post(f"/v1/runs/{run_id}/tool_outputs", json=body)
    assert again.status_code == 409
    sent = upstream.requests[-1].body["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "tool", "tool"]
    assert {m["tool_call_id"]: m["content"] for m in sent if m["role"] == "tool"} == {
        LOC: '{"city":"Oslo"}',
        CALC: "4",
    }
    kinds = [e["kind"] for e in await history(api, sid)]
    assert kinds.count("tool_call") == 2 and kinds.count("tool_result") == 2


async def test_a_wait_returns_once_the_run_needs_the_clients_outputs(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    """Not at its timeout: a run that waits for the client cannot end without it."""
    sid = (await new_session(api, config={"tools": [LOCATE]}))["id"]
    upstream.script(ToolCall("call_loc", "get_location", "{}"))
    asked = await api.post(f"/v1/sessions/{sid}/ask", json={"input": "where?", "stream": False})
    waited = await api.get(
        f"/v1/runs/{asked.json()['id']}",
        params={"wait": "true", "timeout": 600},
        timeout=120,  # far below the wait's own timeout: a wait that ran to it fails here
    )
    assert waited.json()["status"] == "requires_action"


async def test_a_run_waiting_for_outputs_keeps_its_session_busy(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    """The session stays active while its run waits: another ask is refused, not started."""
    sid, run_id, _ = await waiting_run(api, upstream)
    busy = await api.post(f"/v1/sessions/{sid}/ask", json={"input": "and?", "stream": False})
    assert busy.status_code == 409 and busy.json()["error"]["code"] == "session_busy"
    assert busy.json()["error"]["details"]["active_run_id"] == run_id
    assert (await api.get(f"/v1/sessions/{sid}")).json()["status"] == "active"


async def test_an_abandoned_run_expires(api: httpx.AsyncClient, upstream: FakeUpstream) -> None:
    _, run_id, _ = await waiting_run(api, upstream)
    await asyncio.sleep(3.5)  # the tests' expiry is 3 s
    run = (await api.get(f"/v1/runs/{run_id}", params={"wait": "true", "timeout": 10})).json()
    assert run["status"] == "failed" and run["error"]["code"] == "tool_outputs_timeout"
