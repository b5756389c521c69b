"""Transient provider faults after the answer began streaming (an overloaded or garbled stream,
a dropped connection, a stall, a body cut short), through the real SDKs and the served app.

A fault that happens once is retried within the router's retries: clients get
`message.reset` {reason: provider_retry, attempt} and then the new answer; the journal keeps
the voided partial answer, incomplete and rolled back at once, so the retried call (and every
later one) is sent exactly what the first was; no tool runs twice. A fault that persists fails
the run with a provider_* error and the last partial answer, journaled incomplete, as before.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request

from app.config import Settings
from app.main import create_app
from testkit.api import history, new_session
from testkit.server import serve_in_thread, stop_thread_server
from testkit.sse_client import Event, streamed_ask
from testkit.upstream import (
    FailMidStream,
    FakeUpstream,
    Malformed,
    Stall,
    Step,
    Text,
    ToolCall,
    Truncate,
    Usage,
)
from tests.conftest import issue_key
from tests.e2e import create_database, e2e_env

RETRIES = 2  # llm_max_retries here: 3 calls in all
MODELS = {"openai": "openai:gpt-4o-mini", "anthropic": "anthropic:claude-haiku-4-5"}
# Each fault after output began, and the error a run ends with when it persists.
FAULTS: dict[str, tuple[Step, str]] = {
    "overloaded": (FailMidStream("overloaded", "Overloaded"), "provider_overloaded"),
    "dropped_connection": (FailMidStream(disconnect=True), "provider_connection"),
    "stall": (Stall(10), "provider_timeout"),  # llm_request_timeout_seconds is 1 here
    "truncated": (Truncate(), "provider_server"),
    "malformed": (Malformed(), "provider_bad_response"),
}
RESET = {"reason": "provider_retry", "attempt": 1}


@pytest.fixture(scope="module")
def faults_service(database_url: str, upstream: FakeUpstream) -> Iterator[tuple[str, str]]:
    """The served app (API and workers) on a database of its own, with a short stall timeout
    and a known retry count: its URL and a key."""
    settings = Settings(
        database_url=create_database(database_url, "faults"),
        **{**e2e_env(upstream), "llm_max_retries": RETRIES, "llm_request_timeout_seconds": 1.0},
    )
    server, thread, url = serve_in_thread(create_app(settings, workers=2))
    yield url, issue_key(settings, f"faults-{uuid.uuid4()}")
    stop_thread_server(server, thread)


@pytest.fixture
async def api(
    faults_service: tuple[str, str], upstream: FakeUpstream
) -> AsyncIterator[httpx.AsyncClient]:
    upstream.clear()
    url, key = faults_service
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as client:
        yield client


class ToolServer:
    """A webhook tool that counts its executions."""

    def __init__(self) -> None:
        self.executions: Counter[str] = Counter()
        app = FastAPI()

        @app.post("/lookup")
        async def lookup(request: Request) -> dict[str, int]:
            self.executions[request.headers["idempotency-key"]] += 1
            return {"answer": 42}

        self.server, self.thread, self.url = serve_in_thread(app)

    @property
    def tool(self) -> dict[str, Any]:
        return {"name": "lookup", "kind": "webhook", "url": f"{self.url}/lookup"}


@pytest.fixture(scope="module")
def tools() -> Iterator[ToolServer]:
    server = ToolServer()
    yield server
    stop_thread_server(server.server, server.thread)


def text_around_resets(events: list[Event]) -> list[str]:
    """The streamed text between message.reset events: one string per model call."""
    parts = [""]
    for event in events:
        if event.type == "message.reset":
            parts.append("")
        elif event.type == "message.delta":
            parts[-1] += event.data["text"]
    return parts


def assistant_entries(journal: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in journal if e["kind"] == "message" and e["payload"]["role"] == "assistant"]


def rolled_back(journal: list[dict[str, Any]]) -> list[tuple[int, int, str]]:
    return [
        (e["payload"]["from_seq"], e["payload"]["to_seq"], e["payload"]["reason"])
        for e in journal
        if e["kind"] == "rollback"
    ]


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("provider", MODELS)
async def test_a_fault_after_output_began_is_retried(
    api: httpx.AsyncClient, upstream: FakeUpstream, provider: str, fault: str
) -> None:
    sid = (await new_session(api, config={"model": MODELS[provider]}))["id"]
    upstream.script(Text("half "), Text("an answer"), FAULTS[fault][0])
    upstream.script(Text("the whole "), Text("answer"), Usage(12, 3))

    events = await streamed_ask(api, sid, "hello")

    assert events[-1].type == "run.completed", events[-1].data
    assert events[-1].data["text"] == "the whole answer"
    assert [e.data for e in events if e.type == "message.reset"] == [RESET]
    assert text_around_resets(events) == ["half an answer", "the whole answer"]
    first, second = upstream.requests
    assert second.body == first.body  # asked again with exactly the same context

    journal = await history(api, sid)
    partial, answer = assistant_entries(journal)
    assert partial["payload"] == {
        "role": "assistant",
        "content": "half an answer",
        "status": "incomplete",
    }
    assert rolled_back(journal) == [(partial["seq"], partial["seq"], "provider_retry")]
    assert answer["payload"] == {
        "role": "assistant",
        "content": "the whole answer",
        "finish_reason": "stop",
    }
    assert [e["kind"] for e in journal].count("run_end") == 1
    committed = {e.data["seq"] for e in events if e.type == "entry.committed"}
    assert {partial["seq"], partial["seq"] + 1, answer["seq"]} <= committed

    # The voided answer never reaches the model again; the one that replaced it does.
    upstream.script(Text("sure"))
    assert (await streamed_ask(api, sid, "and then?"))[-1].type == "run.completed"
    sent = json.dumps(upstream.requests[-1].body)
    assert "half an answer" not in sent and "the whole answer" in sent


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("provider", MODELS)
async def test_a_fault_that_persists_fails_the_run_with_the_partial_answer(
    api: httpx.AsyncClient, upstream: FakeUpstream, provider: str, fault: str
) -> None:
    step, code = FAULTS[fault]
    sid = (await new_session(api, config={"model": MODELS[provider]}))["id"]
    for call in range(RETRIES + 1):
        upstream.script(Text(f"try {call}, "), Text("partial"), step)
    upstream.script(Text("never sent"))

    events = await streamed_ask(api, sid, "hello")

    assert events[-1].type == "run.failed"
    assert events[-1].data["error"]["code"] == code
    assert events[-1].data["partial_text"] == f"try {RETRIES}, partial"
    assert [e.data for e in events if e.type == "message.reset"] == [RESET] * RETRIES
    assert text_around_resets(events) == [f"try {c}, partial" for c in range(RETRIES + 1)]
    assert len(upstream.requests) == RETRIES + 1 and upstream.pending == 1
    assert len({json.dumps(r.body) for r in upstream.requests}) == 1

    journal = await history(api, sid)
    partials = assistant_entries(journal)
    assert [e["payload"] for e in partials] == [
        {"role": "assistant", "content": f"try {c}, partial", "status": "incomplete"}
        for c in range(RETRIES + 1)
    ]
    # The voided ones are rolled back; the last is the failed run's answer, as it always was.
    assert rolled_back(journal) == [(e["seq"], e["seq"], "provider_retry") for e in partials[:-1]]
    run_id = events[0].data["run_id"]
    # Written from a context that starts at the ask (seq 1), as its refs record.
    assert partials[-1]["refs"] == {"run_id": run_id, "context_from": 1}
    run = (await api.get(f"/v1/runs/{run_id}")).json()
    assert run["status"] == "failed" and run["result"] == f"try {RETRIES}, partial"
    assert run["error"]["code"] == code

    upstream.script(Text("sure"))
    assert (await streamed_ask(api, sid, "and then?"))[-1].type == "run.completed"
    sent = json.dumps(upstream.requests[-1].body)
    assert f"try {RETRIES}, partial" in sent
    assert not any(f"try {c}," in sent for c in range(RETRIES))


@pytest.mark.parametrize("fault", ["overloaded", "malformed"])
@pytest.mark.parametrize("provider", MODELS)
async def test_a_tool_call_streamed_before_the_fault_runs_once(
    api: httpx.AsyncClient, upstream: FakeUpstream, tools: ToolServer, provider: str, fault: str
) -> None:
    config = {"model": MODELS[provider], "tools": [tools.tool]}
    sid = (await new_session(api, config=config))["id"]
    # The call is streamed whole, then the stream fails before the turn is finished.
    upstream.script(Text("Let me look."), ToolCall("c1", "lookup", "{}"), FAULTS[fault][0])
    upstream.script(Text("Let me look."), ToolCall("c1", "lookup", "{}"))
    upstream.script(Text("It is 42."))

    events = await streamed_ask(api, sid, "what is it?")

    assert events[-1].type == "run.completed" and events[-1].data["text"] == "It is 42."
    run_id = events[0].data["run_id"]
    assert [e.data for e in events if e.type == "message.reset"] == [RESET]
    assert sum(1 for e in events if e.type == "tool_call") == 1
    assert sum(tools.executions[k] for k in tools.executions if k.startswith(run_id)) == 1
    journal = await history(api, sid)
    kinds = Counter(e["kind"] for e in journal)
    assert kinds["tool_call"] == 1 and kinds["tool_result"] == 1
    assert [e["payload"].get("status") for e in assistant_entries(journal)] == [
        "incomplete",  # the voided "Let me look.", rolled back
        None,  # the tool turn's text
        None,  # the answer
    ]
    assert upstream.requests[1].body == upstream.requests[0].body
    assert json.dumps(upstream.requests[2].body).count("Let me look.") == 1


@pytest.mark.parametrize("provider", MODELS)
async def test_a_fault_after_the_tools_ran_retries_the_model_call_not_the_tools(
    api: httpx.AsyncClient, upstream: FakeUpstream, tools: ToolServer, provider: str
) -> None:
    config = {"model": MODELS[provider], "tools": [tools.tool]}
    sid = (await new_session(api, config=config))["id"]
    upstream.script(ToolCall("c1", "lookup", "{}"))
    upstream.script(Text("It is "), FailMidStream("overloaded"))
    upstream.script(Text("It is 42."))

    events = await streamed_ask(api, sid, "what is it?")

    assert events[-1].type == "run.completed" and events[-1].data["text"] == "It is 42."
    run_id = events[0].data["run_id"]
    assert sum(tools.executions[k] for k in tools.executions if k.startswith(run_id)) == 1
    assert sum(1 for e in events if e.type == "tool_call") == 1
    assert [e.data for e in events if e.type == "message.reset"] == [RESET]
    # The retried call is sent what the failed one was: the call and its one result.
    assert upstream.requests[2].body == upstream.requests[1].body
    kinds = Counter(e["kind"] for e in await history(api, sid))
    assert kinds["tool_call"] == 1 and kinds["tool_result"] == 1 and kinds["rollback"] == 1
