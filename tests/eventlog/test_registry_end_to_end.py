"""Every event the real service streams matches its registry model and the OpenAPI document's
event-stream schema, and every type is seen.

Real asks against `threadline serve` (API + workers) and the fake upstream driven through the
real SDKs: text answers, a built-in tool, a client-side tool, a provider failure, a policy
violation, a cancel, auto-compaction (done, failed, still pending), a compaction job, and a
run retried after its worker died. Each event is read over SSE and validated against the model
of its type and against the `text/event-stream` schema the served document declares; each run
is then replayed from GET /v1/runs/{id}/events and must be the same.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import jsonschema_rs
from pydantic import ValidationError
from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncEngine

from app.config import Settings
from app.db.tables import runs
from app.eventlog.registry import TERMINAL_EVENTS, EventType, UnknownEventType, parse
from app.main import create_app
from testkit.api import new_session
from testkit.sse_client import Event, events
from testkit.upstream import (
    Fail,
    FailMidStream,
    FakeUpstream,
    Hold,
    RedactedThinking,
    Text,
    Thinking,
    ToolCall,
    Usage,
)
from tests.api.test_compaction import AUTO_POLICY, held_summarizer, landed_summary

# Types no scenario below provokes, each with the reason. Empty: every type is covered.
KNOWN_GAPS: dict[EventType, str] = {}

CALCULATOR = {"name": "calculator", "kind": "builtin"}
LOCATE = {"name": "get_location", "kind": "client", "description": "Where the user is"}
FILLER = "lorem ipsum dolor sit amet " * 25  # about 120 tokens a message
# Every stream here ends well within this; it only keeps a broken one from hanging the test.
STREAM_SECONDS = 60


def event_stream_validator(document: dict[str, Any]) -> jsonschema_rs.Draft202012Validator:
    """A validator of one SSE event ({id, event, data}, as a client reads it) against the
    schema the document gives the text/event-stream of `streamRunEvents`."""
    (operation,) = [
        op
        for ops in document["paths"].values()
        for op in ops.values()
        if op["operationId"] == "streamRunEvents"
    ]
    schema = operation["responses"]["200"]["content"]["text/event-stream"]["schema"]
    # Its `#/components/...` references resolve in the document's components, carried along.
    return jsonschema_rs.Draft202012Validator({**schema, "components": document["components"]})


class Wire:
    """What the test received: every event checked against its model and the served
    document's schema, counted by type."""

    def __init__(self, api: httpx.AsyncClient, document: dict[str, Any]) -> None:
        self.api = api
        self.documented = event_stream_validator(document)
        self.seen: Counter[str] = Counter()

    def check(self, received: list[Event]) -> list[Event]:
        for event in received:
            try:
                parse(event.type, event.data)
            except (ValidationError, UnknownEventType) as exc:
                raise AssertionError(f"{event.type} #{event.id} {event.data}:\n{exc}") from exc
            as_read = {"id": str(event.id), "event": event.type, "data": event.data}
            try:
                self.documented.validate(as_read)
            except jsonschema_rs.ValidationError as exc:
                raise AssertionError(f"not as documented: {as_read}:\n{exc}") from exc
            self.seen[event.type] += 1
        return received

    async def stream(
        self,
        method: str,
        url: str,
        on_event: Callable[[Event], Awaitable[None]] | None = None,
        **kwargs: Any,
    ) -> list[Event]:
        """A stream's events, read until the server ends it, each checked as it arrives."""
        received: list[Event] = []
        async with asyncio.timeout(STREAM_SECONDS):
            async with self.api.stream(method, url, **kwargs) as response:
                assert response.status_code == 200, (await response.aread()).decode()
                async for event in events(response):
                    self.check([event])
                    received.append(event)
                    if on_event is not None:
                        await on_event(event)
        return received

    async def ask(
        self, sid: str, text: str, on_event: Callable[[Event], Awaitable[None]] | None = None
    ) -> list[Event]:
        """An ask streamed to its end: the whole run, checked and compared with its replay."""
        run = await self.stream("POST", f"/v1/sessions/{sid}/ask", on_event, json={"input": text})
        await self.replayed(run)
        return run

    async def run(self, run_id: str) -> list[Event]:
        """A run's events from its first, checked and compared with what a second read gets."""
        run = await self.stream("GET", f"/v1/runs/{run_id}/events")
        await self.replayed(run)
        return run

    async def replayed(self, run: list[Event]) -> None:
        """The run as streamed is whole (seqs 1.., one terminal event, last) and is what a
        client reading it again afterwards gets."""
        assert [e.id for e in run] == list(range(1, len(run) + 1))
        assert [e.type for e in run if e.type in TERMINAL_EVENTS] == [run[-1].type]
        replay = await self.stream("GET", f"/v1/runs/{run[0].data['run_id']}/events")
        assert replay == run


def types(run: list[Event]) -> list[str]:
    return [e.type for e in run]


def data(run: list[Event], event_type: str) -> dict[str, Any]:
    return next(e.data for e in run if e.type == event_type)


async def test_every_event_on_the_wire_matches_its_model_and_every_type_is_seen(
    api: httpx.AsyncClient, upstream: FakeUpstream, e2e_engine: AsyncEngine
) -> None:
    wire = Wire(api, (await api.get("/openapi.json")).json())
    await answers(wire, upstream)
    await reasoning(wire, upstream)
    await builtin_tool(wire, upstream)
    await client_tool(wire, upstream)
    await failures(wire, upstream)
    await cancel(wire, upstream)
    await auto_compaction(wire, upstream)
    await compaction_job(wire, upstream)
    await retried_after_a_worker_died(wire, upstream, e2e_engine)
    await steered(wire, upstream)
    await approval(wire, upstream)

    never = set(EventType) - set(wire.seen) - set(KNOWN_GAPS)
    assert not never, f"no scenario produced {sorted(never)}: add one, or a KNOWN_GAPS reason"
    assert not set(KNOWN_GAPS) & set(wire.seen), "a known gap is covered now: drop it"


async def answers(wire: Wire, upstream: FakeUpstream) -> None:
    sid = (await new_session(wire.api))["id"]
    upstream.script(Text("Hel"), Text("lo"), Usage(12, 2, cached=4))
    run = await wire.ask(sid, "hi")
    assert types(run)[:2] == ["run.created", "run.started"]
    assert run[-1].type == "run.completed" and run[-1].data["text"] == "Hello"
    assert data(run, "usage")["cached_tokens"] == 4
    # A server that reports no usage: counted by the service, and flagged so.
    upstream.script(Text("Counted."), report_usage=False)
    run = await wire.ask(sid, "and now?")
    assert data(run, "usage")["estimated"] is True


async def reasoning(wire: Wire, upstream: FakeUpstream) -> None:
    config = {"model": "anthropic:claude-sonnet-4-5", "reasoning": {"effort": "low"}}
    sid = (await new_session(wire.api, config=config))["id"]
    upstream.script(Thinking("Hmm."), RedactedThinking(), Text("Hi"))
    run = await wire.ask(sid, "hi")
    assert run[-1].type == "run.completed" and run[-1].data["text"] == "Hi"
    pieces = [e.data for e in run if e.type == "reasoning.delta"]
    assert pieces[0]["start"] is True and pieces[-1]["redacted"] is True


async def builtin_tool(wire: Wire, upstream: FakeUpstream) -> None:
    sid = (await new_session(wire.api, config={"tools": [CALCULATOR]}))["id"]
    upstream.script(ToolCall("up_1", "calculator", '{"expression": "6*7"}'))
    upstream.script(Text("42"))
    run = await wire.ask(sid, "6 times 7?")
    assert run[-1].type == "run.completed" and run[-1].data["text"] == "42"
    pieces = [e.data for e in run if e.type == "tool_call.delta"]
    assert "name" in pieces[0] and "name" not in pieces[-1]  # only where the model named it
    assert data(run, "tool_result")["preview"] == "42"


async def client_tool(wire: Wire, upstream: FakeUpstream) -> None:
    sid = (await new_session(wire.api, config={"tools": [LOCATE]}))["id"]
    upstream.script(ToolCall("up_1", "get_location", "{}"))
    upstream.script(Text("You are in Oslo."))

    run_id = ""

    async def send_the_output(event: Event) -> None:
        nonlocal run_id
        if event.type == "run.created":
            run_id = event.data["run_id"]
        if event.type == "run.requires_action":
            [call] = event.data["tool_calls"]
            outputs = [{"tool_call_id": call["tool_call_id"], "output": "Oslo"}]
            sent = await wire.api.post(
                f"/v1/runs/{run_id}/tool_outputs", json={"tool_outputs": outputs}
            )
            assert sent.status_code == 200, sent.text

    run = await wire.ask(sid, "where am I?", send_the_output)
    assert "run.requires_action" in types(run)
    assert run[-1].type == "run.completed" and run[-1].data["text"] == "You are in Oslo."


async def approval(wire: Wire, upstream: FakeUpstream) -> None:
    """A call that waits for a person's approval, approved while the stream is open."""
    policy = {"tool_approval": {"default": "ask"}}
    sid = (await new_session(wire.api, config={"tools": [CALCULATOR], "run_policy": policy}))["id"]
    upstream.script(ToolCall("up_1", "calculator", '{"expression": "6*7"}'))
    upstream.script(Text("42."))
    run_id = ""

    async def approve(event: Event) -> None:
        nonlocal run_id
        if event.type == "run.created":
            run_id = event.data["run_id"]
        if event.type == "run.awaiting_approval":
            rulings = [{"tool_call_id": "call_1_1_0", "decision": "approve"}]
            sent = await wire.api.post(f"/v1/runs/{run_id}/approvals", json={"approvals": rulings})
            assert sent.status_code == 200, sent.text

    run = await wire.ask(sid, "6*7?", approve)
    assert "tool.approval_requested" in types(run) and "tool.approval_answered" in types(run)
    assert run[-1].type == "run.completed" and run[-1].data["text"] == "42."


async def failures(wire: Wire, upstream: FakeUpstream) -> None:
    sid = (await new_session(wire.api))["id"]
    upstream.script(Text("half an "), FailMidStream("bad_request", "the upstream gave up"))
    run = await wire.ask(sid, "go")
    assert run[-1].type == "run.failed", run[-1]
    assert run[-1].data["partial_text"] == "half an "
    assert run[-1].data["error"]["code"] == "provider_bad_request"
    # A policy limit broken during the run: the error names the rule.
    policy = {"max_total_tokens": 100}
    sid = (await new_session(wire.api, config={"tools": [CALCULATOR], "run_policy": policy}))["id"]
    upstream.script(ToolCall("up_1", "calculator", '{"expression": "1+1"}'), Usage(70, 40))
    run = await wire.ask(sid, "go")
    assert run[-1].type == "run.failed" and run[-1].data["error"]["rule"] == "max_total_tokens"


async def cancel(wire: Wire, upstream: FakeUpstream) -> None:
    sid = (await new_session(wire.api))["id"]
    release = threading.Event()
    upstream.script(Text("so far"), Hold(release))

    run_id = ""

    async def cancel_after_the_first_words(event: Event) -> None:
        nonlocal run_id
        if event.type == "run.created":
            run_id = event.data["run_id"]
        if event.type == "message.delta":
            assert (await wire.api.post(f"/v1/runs/{run_id}/cancel")).status_code == 200

    try:
        run = await wire.ask(sid, "go", cancel_after_the_first_words)
    finally:
        release.set()
    assert run[-1].type == "run.cancelled"
    assert run[-1].data["partial_text"] == "so far" and run[-1].data["reason"] == "cancel"


async def filled_session(wire: Wire, upstream: FakeUpstream, **policy: Any) -> str:
    """A session whose next big ask overflows its small budget (summarization: auto)."""
    config = {"context_policy": {**AUTO_POLICY, **policy}}
    sid = str((await new_session(wire.api, config=config))["id"])
    for i in range(3):
        upstream.script(Text(f"noted {i}"))
        run = await wire.ask(sid, f"fact {i}: {FILLER}")
        assert run[-1].type == "run.completed"
    return sid


async def auto_compaction(wire: Wire, upstream: FakeUpstream) -> None:
    big = f"fact 3: {FILLER} " * 6
    sid = await filled_session(wire, upstream)
    upstream.script(Text("AUTO SUMMARY"), Usage(500, 5))
    upstream.script(Text("answer after compaction"))
    run = await wire.ask(sid, big)
    assert run[-1].type == "run.completed"
    assert {"context.warning", "context.compacting", "context.compacted"} <= set(types(run))

    sid = await filled_session(wire, upstream)
    upstream.script(Fail(400, "bad_request", "summarizer refused"))
    upstream.script(Text("answered anyway"))
    run = await wire.ask(sid, big)
    assert run[-1].type == "run.completed" and "context.compaction_failed" in types(run)

    sid = await filled_session(wire, upstream, compaction_wait_seconds=0.5)
    release = threading.Event()
    upstream.respond_with(held_summarizer(release, "LATE SUMMARY", "answered from windowing"))
    try:
        run = await wire.ask(sid, big)
    finally:
        release.set()
    assert run[-1].type == "run.completed"
    pending = data(run, "context.compaction_pending")
    assert "from_seq" in pending and "run_id" not in pending
    await landed_summary(wire.api, sid)  # the background summary is done before going on
    upstream.respond_with(None)


async def compaction_job(wire: Wire, upstream: FakeUpstream) -> None:
    policy = {"compaction_wait_seconds": 0.5}
    sid = (await new_session(wire.api, config={"context_policy": policy}))["id"]
    for i in range(4):
        upstream.script(Text(f"answer {i}"))
        await wire.ask(sid, f"question {i}")
    release = threading.Event()
    upstream.respond_with(held_summarizer(release, "JOB SUMMARY", "answered meanwhile"))
    try:
        job = (
            await wire.api.post(f"/v1/sessions/{sid}/compact", json={"keep_last_turns": 1})
        ).json()
        started = asyncio.create_task(wire.run(job["id"]))
        run = await wire.ask(sid, "question 4")  # behind the job, answered from windowing
        assert data(run, "context.compaction_pending")["run_id"] == job["id"]
    finally:
        release.set()
    compaction = await started
    assert types(compaction)[0] == "run.created" and compaction[0].data["kind"] == "compaction"
    assert data(compaction, "context.compacted")["reason"] == "requested"
    assert compaction[-1].type == "run.completed"
    assert compaction[-1].data["text"] == "JOB SUMMARY"
    upstream.respond_with(None)


async def retried_after_a_worker_died(
    wire: Wire, upstream: FakeUpstream, e2e_engine: AsyncEngine
) -> None:
    """A run whose first attempt died leaves it `running` with one attempt and its job queued
    again (procrastinate's stalled-job retry); the worker that takes the job next resets the
    answer. The state is made here, cheaply: a run queued behind another is given it before
    the other ends. (Killing a real worker process: tests/worker/test_crash.py.)"""
    sid = (await new_session(wire.api))["id"]
    release = threading.Event()
    upstream.script(Text("first"), Hold(release))
    try:
        first = (
            await wire.api.post(f"/v1/sessions/{sid}/ask", json={"input": "1", "stream": False})
        ).json()
        async with asyncio.timeout(STREAM_SECONDS):
            async with wire.api.stream("GET", f"/v1/runs/{first['id']}/events") as response:
                async for event in events(response):
                    if event.type == "message.delta":  # its worker is in the model call
                        break
        upstream.script(Text("the retried answer"))
        body = {"input": "2", "stream": False, "multitask_strategy": "enqueue"}
        second = (await wire.api.post(f"/v1/sessions/{sid}/ask", json=body)).json()
        async with e2e_engine.begin() as conn:
            died = await conn.execute(
                update(runs)
                .where(runs.c.id == second["id"], runs.c.status == "queued")
                .values(status="running", attempts=1)
            )
            assert died.rowcount == 1  # still queued behind the first run: no worker has it
    finally:
        release.set()
    assert (await wire.run(first["id"]))[-1].type == "run.completed"
    run = await wire.run(second["id"])
    assert types(run)[:3] == ["run.created", "message.reset", "run.started"]
    assert data(run, "message.reset") == {"reason": "retry", "attempt": 2}
    assert run[-1].type == "run.completed" and run[-1].data["text"] == "the retried answer"


async def steered(wire: Wire, upstream: FakeUpstream) -> None:
    """A message sent while the run's model turn is held lands before its next turn."""
    sid = (await new_session(wire.api, config={"tools": [CALCULATOR]}))["id"]
    release = threading.Event()
    upstream.script(Hold(release), ToolCall("c1", "calculator", '{"expression": "2*3"}'))
    upstream.script(Text("6, in metric"))
    asked = len(upstream.requests)
    try:
        first = (
            await wire.api.post(f"/v1/sessions/{sid}/ask", json={"input": "2*3", "stream": False})
        ).json()
        await upstream.requests_arrived(asked + 1)  # its first model turn is held
        body = {"input": "in metric", "stream": False, "multitask_strategy": "steer"}
        steer = await wire.api.post(f"/v1/sessions/{sid}/ask", json=body)
        assert steer.status_code == 202 and steer.json()["id"] == first["id"]
    finally:
        release.set()
    run = await wire.run(first["id"])
    assert data(run, "run.steered")["iteration"] == 2
    assert run[-1].type == "run.completed"


def test_the_documented_schema_tells_events_apart() -> None:
    """The check above has teeth: the schema refuses a payload of another type, an unknown
    type, and a field of the wrong type."""
    validator = event_stream_validator(create_app(Settings()).openapi())
    assert validator.is_valid({"id": "3", "event": "message.delta", "data": {"text": "Hel"}})
    for wrong in (
        {"id": "3", "event": "message.delta", "data": {"text": 1}},
        {"id": "3", "event": "message.delta", "data": {"attempt": 2, "reason": "retry"}},
        {"id": "3", "event": "message.deleted", "data": {"text": "Hel"}},
        {"id": "three", "event": "message.delta", "data": {"text": "Hel"}},
    ):
        assert not validator.is_valid(wrong), wrong
