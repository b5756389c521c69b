"""Tool approval: a call whose tool's rule is `ask` waits for a person (approve, edit,
reject), holding no worker; rulings survive partial answers, cancels, forks and expiry."""

from __future__ import annotations

from typing import Any

import httpx

from testkit.api import history, new_session
from testkit.sse_client import collect
from testkit.upstream import FakeUpstream, Text, ToolCall

CALCULATOR = {"name": "calculator", "kind": "builtin"}
ASK = {"tool_approval": {"default": "always", "tools": {"calculator": "ask"}}}
FIRST, SECOND = "call_1_1_0", "call_1_1_1"  # the calls of a new session's first ask


async def waiting_run(
    api: httpx.AsyncClient, upstream: FakeUpstream, *calls: ToolCall, **config: Any
) -> tuple[str, str, list[Any]]:
    """A run stopped at `run.awaiting_approval` on `calls` (calculator calls by default)."""
    config = {"tools": [CALCULATOR], "run_policy": ASK, **config}
    sid = (await new_session(api, config=config))["id"]
    upstream.script(*(calls or [ToolCall("c1", "calculator", '{"expression": "2+2"}')]))
    run = (
        await api.post(f"/v1/sessions/{sid}/ask", json={"input": "compute", "stream": False})
    ).json()
    events = await collect(
        api, "GET", f"/v1/runs/{run['id']}/events", until="run.awaiting_approval"
    )
    assert events[-1].type == "run.awaiting_approval", [e.type for e in events]
    return sid, run["id"], events


async def answer(api: httpx.AsyncClient, run_id: str, *rulings: dict[str, Any]) -> httpx.Response:
    return await api.post(f"/v1/runs/{run_id}/approvals", json={"approvals": list(rulings)})


async def ended(api: httpx.AsyncClient, run_id: str) -> dict[str, Any]:
    done: dict[str, Any] = (
        await api.get(f"/v1/runs/{run_id}", params={"wait": "true", "timeout": 30})
    ).json()
    return done


def tool_results(upstream: FakeUpstream) -> dict[str, str]:
    """The tool results the model was sent in its last call."""
    sent = upstream.requests[-1].body["messages"]
    return {m["tool_call_id"]: m["content"] for m in sent if m["role"] == "tool"}


async def test_an_approved_call_runs_and_the_run_completes(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid, run_id, events = await waiting_run(api, upstream)
    requested = [e for e in events if e.type == "tool.approval_requested"]
    assert [(e.data["tool_call_id"], e.data["name"]) for e in requested] == [(FIRST, "calculator")]
    assert requested[0].data["arguments"] == {"expression": "2+2"}
    assert "tool_result" not in [e.type for e in events]  # nothing ran before the ruling
    run = (await api.get(f"/v1/runs/{run_id}")).json()
    assert run["status"] == "awaiting_approval"
    listed = (await api.get(f"/v1/runs/{run_id}/approvals")).json()
    assert [(a["tool_call_id"], a["status"]) for a in listed["approvals"]] == [(FIRST, "pending")]

    upstream.script(Text("It is 4."))
    resumed = await answer(api, run_id, {"tool_call_id": FIRST, "decision": "approve"})
    assert resumed.status_code == 200, resumed.text
    assert resumed.json()["run"]["status"] == "queued"
    assert resumed.json()["approvals"][0]["status"] == "approved"
    done = await ended(api, run_id)
    assert done["status"] == "completed" and done["result"] == "It is 4."
    assert tool_results(upstream) == {FIRST: "4"}
    all_events = await collect(api, "GET", f"/v1/runs/{run_id}/events")
    answered = [e.data for e in all_events if e.type == "tool.approval_answered"]
    assert answered == [{"tool_call_id": FIRST, "name": "calculator", "decision": "approved"}]
    again = await answer(api, run_id, {"tool_call_id": FIRST, "decision": "approve"})
    assert again.status_code == 409 and again.json()["error"]["code"] == "run_not_waiting"
    listed = (await api.get(f"/v1/runs/{run_id}/approvals")).json()
    assert listed["approvals"][0]["executed"] is True
    kinds = [e["kind"] for e in await history(api, sid)]
    assert kinds.count("tool_call") == 1 and kinds.count("tool_result") == 1
