"""Tool approval under crashes and races, with worker and API processes of their own: an
approved call runs at most once, whether the approval is posted twice at once on two API
processes (the tests' own and a `threadline serve`) or the worker is killed (-9) while the run
waits or after the approval."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from app.config import Settings
from app.core.approvals import EXPIRED_TEXT, INTERRUPTED_TEXT
from app.core.tool_loop import thread_call_id
from testkit.api import history, new_session
from testkit.server import free_port
from testkit.sse_client import collect
from testkit.upstream import FakeUpstream, Text, ToolCall
from tests.e2e import Process, process_env
from tests.worker.conftest import Workers
from tests.worker.test_crash import Receiver, receiver, wait_for, webhook

__all__ = ["receiver"]  # the fixture, shared with test_crash

ASK = {"tool_approval": {"default": "ask"}}


async def waiting_run(
    client: httpx.AsyncClient, upstream: FakeUpstream, tool: dict[str, Any]
) -> tuple[str, dict[str, Any], str]:
    """A run waiting for approval of one call of `tool`: (session, run, the call's id)."""
    sid = (await new_session(client, config={"tools": [tool], "run_policy": ASK}))["id"]
    upstream.script(ToolCall("c1", str(tool["name"]), "{}"))
    run = (
        await client.post(f"/v1/sessions/{sid}/ask", json={"input": "q", "stream": False})
    ).json()
    events = await collect(
        client, "GET", f"/v1/runs/{run['id']}/events", until="run.awaiting_approval"
    )
    assert events[-1].type == "run.awaiting_approval"
    return sid, run, thread_call_id(run["user_entry_seq"], 1, 0)


def approve(call_id: str) -> dict[str, Any]:
    return {"approvals": [{"tool_call_id": call_id, "decision": "approve"}]}


async def ended(client: httpx.AsyncClient, run_id: str) -> dict[str, Any]:
    done: dict[str, Any] = (
        await client.get(f"/v1/runs/{run_id}", params={"wait": "true", "timeout": 60})
    ).json()
    return done


async def result_of(client: httpx.AsyncClient, sid: str) -> dict[str, Any]:
    results = [e for e in await history(client, sid) if e["kind"] == "tool_result"]
    assert len(results) == 1
    payload: dict[str, Any] = results[0]["payload"]
    return payload


@pytest.fixture
def other_api(crash_settings: Settings) -> Iterator[str]:
    """A second API process (no workers) on the crash database, beside the tests' own."""
    port = free_port()
    env = process_env(crash_settings, worker_concurrency=0, port=port)
    process = Process(["serve", "--port", str(port)], env, f"http://127.0.0.1:{port}/readyz")
    yield f"http://127.0.0.1:{port}"
    process.stop()


@pytest.mark.slow
async def test_two_approvals_posted_at_once_on_two_api_processes_run_the_call_once(
    api_only: httpx.AsyncClient,
    upstream: FakeUpstream,
    workers: Workers,
    receiver: Receiver,
    other_api: str,
) -> None:
    sid, run, call_id = await waiting_run(api_only, upstream, webhook("fast", receiver.url))
    upstream.script(Text("sent"))
    headers = {"Authorization": api_only.headers["Authorization"]}
    path = f"/v1/runs/{run['id']}/approvals"
    async with httpx.AsyncClient(base_url=other_api, headers=headers, timeout=30) as other:
        posts = await asyncio.gather(
            api_only.post(path, json=approve(call_id)), other.post(path, json=approve(call_id))
        )
    assert sorted(p.status_code for p in posts) == [200, 409], [p.text for p in posts]
    assert (await ended(api_only, run["id"]))["result"] == "sent"
    assert receiver.deliveries[f"{run['id']}:{call_id}"] == 1
    assert (await result_of(api_only, sid))["content"] == {"done": "fast"}


@pytest.mark.slow
async def test_a_worker_killed_while_the_run_waits_loses_nothing(
    api_only: httpx.AsyncClient, upstream: FakeUpstream, workers: Workers, receiver: Receiver
) -> None:
    _, run, call_id = await waiting_run(api_only, upstream, webhook("fast", receiver.url))
    workers.kill_and_replace()  # the run holds no worker: nothing to resume, nothing lost
    upstream.script(Text("sent"))
    posted = await api_only.post(f"/v1/runs/{run['id']}/approvals", json=approve(call_id))
    assert posted.status_code == 200, posted.text
    assert (await ended(api_only, run["id"]))["result"] == "sent"
    assert receiver.deliveries[f"{run['id']}:{call_id}"] == 1


@pytest.mark.slow
async def test_a_worker_killed_after_the_approval_before_the_tool_ran(
    api_only: httpx.AsyncClient, upstream: FakeUpstream, workers: Workers, receiver: Receiver
) -> None:
    _, run, call_id = await waiting_run(api_only, upstream, webhook("fast", receiver.url))
    frozen = workers.processes[-1]
    workers.pause(frozen)  # it cannot take the resumed run
    upstream.script(Text("sent"))
    posted = await api_only.post(f"/v1/runs/{run['id']}/approvals", json=approve(call_id))
    assert posted.json()["run"]["status"] == "queued"
    workers.kill_and_replace()  # the frozen one dies: the fresh worker runs the call, once
    assert (await ended(api_only, run["id"]))["result"] == "sent"
    assert receiver.deliveries[f"{run['id']}:{call_id}"] == 1


@pytest.mark.slow
async def test_a_worker_killed_while_an_approved_call_runs_does_not_run_it_again(
    api_only: httpx.AsyncClient, upstream: FakeUpstream, workers: Workers, receiver: Receiver
) -> None:
    sid, run, call_id = await waiting_run(api_only, upstream, webhook("slow", receiver.url))
    upstream.script(Text("unsure it was sent"))
    await api_only.post(f"/v1/runs/{run['id']}/approvals", json=approve(call_id))
    key = f"{run['id']}:{call_id}"
    await wait_for(lambda: receiver.deliveries[key] == 1)
    workers.kill_and_replace()
    done = await ended(api_only, run["id"])
    assert done["status"] == "completed" and done["result"] == "unsure it was sent"
    # Unlike a call that needed no approval (run again after a crash), it is not repeated:
    # the model reads that it was interrupted.
    assert receiver.deliveries[key] == 1
    result = await result_of(api_only, sid)
    assert result["content"] == INTERRUPTED_TEXT and result["is_error"] is True


@pytest.mark.slow
@pytest.mark.parametrize("worker_settings", [{"tool_approval_timeout_seconds": 2.0}])
async def test_an_unanswered_approval_expires_as_a_rejection(
    api_only: httpx.AsyncClient, upstream: FakeUpstream, workers: Workers, receiver: Receiver
) -> None:
    sid, run, call_id = await waiting_run(api_only, upstream, webhook("fast", receiver.url))
    upstream.script(Text("nobody answered"))
    done = await ended(api_only, run["id"])
    assert done["status"] == "completed" and done["result"] == "nobody answered"
    assert receiver.deliveries[f"{run['id']}:{call_id}"] == 0
    assert (await result_of(api_only, sid))["content"] == EXPIRED_TEXT
    events = await collect(api_only, "GET", f"/v1/runs/{run['id']}/events")
    answered = [e.data for e in events if e.type == "tool.approval_answered"]
    assert answered == [{"tool_call_id": call_id, "name": "fast", "decision": "expired"}]
    late = await api_only.post(f"/v1/runs/{run['id']}/approvals", json=approve(call_id))
    assert late.status_code == 409
