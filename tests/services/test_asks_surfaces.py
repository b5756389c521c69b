"""One ask use case behind every surface: the same conversation, asked through the native API,
the AI SDK chat endpoint and the OpenAI Responses facade, leaves the same journal and the same
run events (ids and timestamps aside)."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.openai_api.items import conversation_id
from testkit.api import history, new_session
from testkit.sse_client import read_to_end
from testkit.upstream import FakeUpstream, Text, ToolCall, Usage

CALCULATOR = {
    "name": "calculator",
    "kind": "builtin",
    "description": "Arithmetic",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
}
MODEL = "openai:gpt-4o-mini"
QUESTIONS = ("What is 6 times 7?", "Thanks!")
_UUID = re.compile(r"[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}")
_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d")

Ask = Callable[[httpx.AsyncClient, str, str], Awaitable[None]]


async def native(api: httpx.AsyncClient, session_id: str, text: str) -> None:
    ended = await read_to_end(api, "POST", f"/v1/sessions/{session_id}/ask", json={"input": text})
    assert ended.status == 200 and ended.events[-1].type == "run.completed", ended


async def ai_sdk(api: httpx.AsyncClient, session_id: str, text: str) -> None:
    """What the AI SDK's DefaultChatTransport posts (the chat's id is the session's)."""
    message = {"id": str(uuid.uuid4()), "role": "user", "parts": [{"type": "text", "text": text}]}
    body = {"id": session_id, "messages": [message], "trigger": "submit-message"}
    async with api.stream("POST", "/v1/ui/chat", json=body) as response:
        raw = (await response.aread()).decode()
    assert response.status_code == 200, raw
    chunks = [line.removeprefix("data: ") for line in raw.splitlines() if line.startswith("data:")]
    assert chunks[-1] == "[DONE]"
    assert json.loads(chunks[-2])["type"] == "finish", chunks


async def openai_responses(api: httpx.AsyncClient, session_id: str, text: str) -> None:
    """What the openai SDK's `responses.create(..., stream=True)` posts."""
    body = {
        "model": MODEL,
        "input": text,
        "conversation": conversation_id(session_id),
        "stream": True,
    }
    async with api.stream("POST", "/openai/v1/responses", json=body) as response:
        raw = (await response.aread()).decode()
    assert response.status_code == 200, raw
    assert "event: response.completed" in raw, raw


def normalized(value: Any, names: dict[str, str]) -> Any:
    """`value` with every uuid named by its first appearance and timestamps blanked."""
    if isinstance(value, dict):
        return {k: normalized(v, names) for k, v in value.items() if k != "created_at"}
    if isinstance(value, list | tuple):
        return [normalized(v, names) for v in value]
    if isinstance(value, str):
        if _TIME.match(value):
            return "<time>"
        return _UUID.sub(lambda m: names.setdefault(m.group(0), f"<id{len(names)}>"), value)
    return value


def merged_deltas(events: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    """Deltas that came close together are sent as one (the writer's tick): a run's stream is
    compared with consecutive deltas of the same text or call joined."""
    out: list[tuple[str, dict[str, Any]]] = []
    for kind, data in events:
        if out and kind == out[-1][0] == "message.delta":
            out[-1] = (kind, {**out[-1][1], "text": out[-1][1]["text"] + data["text"]})
        elif (
            out and kind == out[-1][0] == "tool_call.delta" and data["index"] == out[-1][1]["index"]
        ):
            joined = out[-1][1]["arguments"] + data["arguments"]
            out[-1] = (kind, {**data, **out[-1][1], "arguments": joined})
        else:
            out.append((kind, data))
    return out


async def queue_events(engine: AsyncEngine, run_ids: list[str]) -> list[int]:
    """How many events procrastinate recorded for each run's job: 1 (its end) when the job was
    committed taken by the serving process's handoff, which started the run at once; more when
    procrastinate's worker deferred or fetched it."""
    query = text(
        "SELECT (SELECT count(*) FROM procrastinate_events e WHERE e.job_id = r.job_id)"
        " FROM runs r WHERE r.id = CAST(:id AS uuid)"
    )
    async with engine.connect() as conn:
        return [int((await conn.execute(query, {"id": run_id})).scalar_one()) for run_id in run_ids]


async def conversation(
    api: httpx.AsyncClient, engine: AsyncEngine, upstream: FakeUpstream, ask: Ask
) -> Any:
    """The conversation asked through `ask`: its journal, each run's replayed events and what
    the model was sent, normalized. Each run was handed to the serving process's workers
    with its job (claim at insert)."""
    upstream.clear()
    upstream.script(ToolCall("up_1", "calculator", '{"expression": "6*7"}'), Usage(20, 5))
    upstream.script(Text("It is 42."), Usage(30, 4))
    upstream.script(Text("You are welcome."), Usage(40, 4))
    session = await new_session(api, config={"model": MODEL, "tools": [CALCULATOR]})
    for question in QUESTIONS:
        await ask(api, session["id"], question)
    journal = await history(api, session["id"])
    runs = [e["payload"]["run_id"] for e in journal if e["kind"] == "run_start"]
    assert len(runs) == len(QUESTIONS)
    replays = []
    for run_id in runs:
        replay = await read_to_end(api, "GET", f"/v1/runs/{run_id}/events")
        assert replay.status == 200
        replays.append(merged_deltas([(e.type, e.data) for e in replay.events]))
    sent = [r.body["messages"] for r in upstream.requests]
    assert await queue_events(engine, runs) == [1] * len(runs)
    names: dict[str, str] = {}
    return normalized({"journal": journal, "events": replays, "sent": sent}, names)


@pytest.mark.parametrize("surface", [ai_sdk, openai_responses], ids=["ai_sdk", "openai"])
async def test_a_conversation_is_journaled_and_streamed_alike_through_every_surface(
    api: httpx.AsyncClient, e2e_engine: AsyncEngine, upstream: FakeUpstream, surface: Ask
) -> None:
    expected = await conversation(api, e2e_engine, upstream, native)
    kinds = [e["kind"] for e in expected["journal"]]
    assert kinds.count("tool_result") == 1 and kinds.count("run_end") == 2  # the tool ran
    got = await conversation(api, e2e_engine, upstream, surface)
    assert got["journal"] == expected["journal"]
    for events, native_events in zip(got["events"], expected["events"], strict=True):
        assert events == native_events
    assert got["sent"] == expected["sent"]
