"""Tool approval: a call whose tool's rule is `ask` waits for a person (approve, edit,
reject), holding no worker; rulings survive partial answers, cancels, forks and expiry."""

from __future__ import annotations

import asyncio
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


async def test_a_wait_returns_once_the_run_waits_for_a_person(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    """Not at its timeout; and a run already waiting is waited on until it ends."""
    sid = (await new_session(api, config={"tools": [CALCULATOR], "run_policy": ASK}))["id"]
    upstream.script(ToolCall("c1", "calculator", '{"expression": "2+2"}'))
    asked = await api.post(f"/v1/sessions/{sid}/ask", json={"input": "compute", "stream": False})
    run_id = asked.json()["id"]
    waited = await api.get(
        f"/v1/runs/{run_id}",
        params={"wait": "true", "timeout": 600},
        timeout=120,  # far below the wait's own timeout: a wait that ran to it fails here
    )
    assert waited.json()["status"] == "awaiting_approval"
    upstream.script(Text("4"))
    waiting = asyncio.create_task(ended(api, run_id))
    assert (await answer(api, run_id, {"tool_call_id": FIRST, "decision": "approve"})).is_success
    assert (await waiting)["status"] == "completed"


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


async def test_an_edited_call_runs_with_the_new_arguments_and_a_bad_edit_is_refused(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    _, run_id, _ = await waiting_run(api, upstream)
    bad = await answer(
        api, run_id, {"tool_call_id": FIRST, "decision": "approve", "arguments": {"expression": 5}}
    )
    assert bad.status_code == 422, bad.text
    error = bad.json()["error"]
    assert error["code"] == "invalid_arguments"
    assert error["details"]["tool"] == "calculator" and error["details"]["errors"]
    listed = (await api.get(f"/v1/runs/{run_id}/approvals")).json()
    assert listed["approvals"][0]["status"] == "pending"  # a refused edit changes nothing
    mixed = await answer(
        api, run_id, {"tool_call_id": FIRST, "decision": "reject", "arguments": {"x": 1}}
    )
    assert mixed.status_code == 422

    upstream.script(Text("It is 9."))
    edit = {"tool_call_id": FIRST, "decision": "approve", "arguments": {"expression": "3*3"}}
    assert (await answer(api, run_id, edit)).status_code == 200
    assert (await ended(api, run_id))["status"] == "completed"
    result = tool_results(upstream)[FIRST]
    assert result.endswith("9") and '{"expression": "3*3"}' in result
    events = await collect(api, "GET", f"/v1/runs/{run_id}/events")
    ran = next(e.data for e in events if e.type == "tool_call")
    assert ran["arguments"] == {"expression": "3*3"}


async def test_a_rejected_call_does_not_run_and_the_model_reads_the_reason(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid, run_id, _ = await waiting_run(api, upstream)
    upstream.script(Text("Fine, I will not."))
    rejected = await answer(
        api, run_id, {"tool_call_id": FIRST, "decision": "reject", "reason": "not now"}
    )
    assert rejected.status_code == 200, rejected.text
    assert (await ended(api, run_id))["result"] == "Fine, I will not."
    result = tool_results(upstream)[FIRST]
    assert "rejected" in result and "not now" in result
    listed = (await api.get(f"/v1/runs/{run_id}/approvals")).json()["approvals"]
    assert listed[0]["status"] == "rejected" and listed[0]["executed"] is False
    results = [e for e in await history(api, sid) if e["kind"] == "tool_result"]
    assert results[0]["payload"]["is_error"] is True


async def test_partial_answers_are_kept_until_every_call_is_ruled_on(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    _, run_id, events = await waiting_run(
        api,
        upstream,
        ToolCall("a", "calculator", '{"expression": "1+1"}'),
        ToolCall("b", "calculator", '{"expression": "2+2"}'),
    )
    assert [e.data["tool_call_id"] for e in events if e.type == "tool.approval_requested"] == [
        FIRST,
        SECOND,
    ]
    assert events[-1].data["tool_call_ids"] == [FIRST, SECOND]
    first = await answer(api, run_id, {"tool_call_id": FIRST, "decision": "approve"})
    assert first.status_code == 200
    assert first.json()["run"]["status"] == "awaiting_approval"
    assert [a["status"] for a in first.json()["approvals"]] == ["approved", "pending"]
    twice = await answer(api, run_id, {"tool_call_id": FIRST, "decision": "reject"})
    assert twice.status_code == 409
    assert twice.json()["error"]["code"] == "approval_already_answered"
    unknown = await answer(api, run_id, {"tool_call_id": "call_9_9_9", "decision": "approve"})
    assert unknown.status_code == 422 and unknown.json()["error"]["details"]["unknown"]

    upstream.script(Text("2 and rejected."))
    second = await answer(api, run_id, {"tool_call_id": SECOND, "decision": "reject"})
    assert second.json()["run"]["status"] == "queued"
    assert (await ended(api, run_id))["result"] == "2 and rejected."
    results = tool_results(upstream)
    assert results[FIRST] == "2" and "rejected" in results[SECOND]


async def test_never_tools_are_not_offered_and_their_calls_are_refused(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    never = {"tool_approval": {"tools": {"calculator": "never"}}}
    sid = (await new_session(api, config={"tools": [CALCULATOR], "run_policy": never}))["id"]
    upstream.script(ToolCall("c1", "calculator", '{"expression": "2+2"}'))
    upstream.script(Text("refused"))
    run = (await api.post(f"/v1/sessions/{sid}/ask", json={"input": "q", "stream": False})).json()
    assert (await ended(api, run["id"]))["status"] == "completed"
    assert "tools" not in upstream.requests[0].body  # not offered
    assert "does not allow" in tool_results(upstream)[FIRST]
    # An ask's own rule replaces the session's.
    upstream.script(ToolCall("c2", "calculator", '{"expression": "1+2"}'))
    upstream.script(Text("3"))
    body = {"input": "again", "stream": False, "run_policy": {"tool_approval": {}}}
    run = (await api.post(f"/v1/sessions/{sid}/ask", json=body)).json()
    assert (await ended(api, run["id"]))["status"] == "completed"
    assert [t["function"]["name"] for t in upstream.requests[-2].body["tools"]] == ["calculator"]


async def test_a_cancel_while_waiting_ends_the_run_and_nothing_runs(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid, run_id, _ = await waiting_run(api, upstream)
    cancelled = await api.post(f"/v1/runs/{run_id}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    late = await answer(api, run_id, {"tool_call_id": FIRST, "decision": "approve"})
    assert late.status_code == 409
    kinds = [e["kind"] for e in await history(api, sid)]
    assert "tool_result" not in kinds and kinds[-1] == "run_end"
    assert len(upstream.requests) == 1


async def test_a_fork_at_the_waiting_point_does_not_inherit_the_approval(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid, run_id, _ = await waiting_run(api, upstream)
    rev = (await api.get(f"/v1/sessions/{sid}")).json()["rev"]
    fork = (await api.post(f"/v1/sessions/{sid}/fork", json={"at_seq": rev})).json()
    upstream.script(Text("a fresh start"))
    child = (
        await api.post(f"/v1/sessions/{fork['id']}/ask", json={"input": "hi", "stream": False})
    ).json()
    assert (await ended(api, child["id"]))["result"] == "a fresh start"
    # The fork's model call saw the parent's call answered as interrupted, not run.
    interrupted = tool_results(upstream)
    assert list(interrupted) == [FIRST] and interrupted[FIRST] != "4"
    listed = (await api.get(f"/v1/runs/{child['id']}/approvals")).json()
    assert listed["approvals"] == []
    # The parent still waits, and its approval still works.
    upstream.script(Text("parent done"))
    assert (await answer(api, run_id, {"tool_call_id": FIRST, "decision": "approve"})).is_success
    assert (await ended(api, run_id))["result"] == "parent done"
    assert tool_results(upstream) == {FIRST: "4"}
