"""Steering a running run (multitask_strategy: steer), end to end on `threadline serve`: the
message is committed at once, journaled at the run's next model turn after the current tool
results, and seen by the model there; a run that ends first hands it to the next run."""

from __future__ import annotations

import threading
from typing import Any

import httpx
import pytest

from testkit.api import ended_run, history, new_session
from testkit.sse_client import collect
from testkit.upstream import FakeUpstream, Hold, Text, ToolCall
from tests.core.format_oracles import validate_anthropic, validate_openai

CALCULATOR = {"name": "calculator", "kind": "builtin"}
ONE_PLUS_ONE = '{"expression": "1+1"}'


async def steer(api: httpx.AsyncClient, sid: str, text: str) -> tuple[dict[str, Any], str]:
    body = {"input": text, "stream": False, "multitask_strategy": "steer"}
    response = await api.post(f"/v1/sessions/{sid}/ask", json=body)
    assert response.status_code == 202, response.text
    return response.json(), response.headers["Threadline-Steer-Id"]


def user_texts(message: dict[str, Any]) -> list[str]:
    content = message["content"]
    if isinstance(content, str):
        return [content]
    return [b["text"] for b in content if b.get("type") == "text"]


def wire_messages(request: Any) -> list[dict[str, Any]]:
    body = request.body
    problems = (
        validate_anthropic(body) if request.path.endswith("/messages") else validate_openai(body)
    )
    assert problems == []
    return [m for m in body["messages"] if m["role"] != "system"]


def is_tool_answer(message: dict[str, Any]) -> bool:
    return message["role"] == "tool" or (
        isinstance(message["content"], list)
        and any(b.get("type") == "tool_result" for b in message["content"])
    )


@pytest.mark.parametrize(
    ("model", "call_id"),
    [("openai:gpt-4o-mini", "call_1"), ("anthropic:claude-haiku-4-5", "toolu_01")],
)
async def test_a_message_during_a_three_tool_loop_lands_after_the_current_tool_results(
    api: httpx.AsyncClient, upstream: FakeUpstream, model: str, call_id: str
) -> None:
    release = threading.Event()
    upstream.script(ToolCall(call_id, "calculator", ONE_PLUS_ONE))
    # The second model turn is held: the steer arrives while the loop works.
    upstream.script(Hold(release), ToolCall(call_id, "calculator", ONE_PLUS_ONE))
    upstream.script(ToolCall(call_id, "calculator", ONE_PLUS_ONE))
    upstream.script(Text("Done, and noted."))
    sid = (await new_session(api, config={"model": model, "tools": [CALCULATOR]}))["id"]
    started = await api.post(f"/v1/sessions/{sid}/ask", json={"input": "add", "stream": False})
    run_id = started.json()["id"]
    await upstream.requests_arrived(2)

    steered_run, steer_id = await steer(api, sid, STEER)
    assert steered_run["id"] == run_id  # the answer is the run it steers
    # Committed at once, journaled only at the next model turn: not yet in the journal.
    assert STEER not in [e["payload"].get("content") for e in await history(api, sid)]
    release.set()
    assert (await ended_run(api, run_id))["status"] == "completed"

    events = await collect(api, "GET", f"/v1/runs/{run_id}/events")
    landed = [e.data for e in events if e.type == "run.steered"]
    journal = await history(api, sid)
    message = next(e for e in journal if e["refs"].get("steer_id") == steer_id)
    assert landed == [
        {"steer_id": steer_id, "entry_seq": message["seq"], "iteration": 3, "text": STEER}
    ]
    kinds = [(e["kind"], e["payload"].get("role")) for e in journal]
    at = kinds.index(("message", "user"), 1)  # the steered message, after the run's input
    assert kinds[at - 1] == ("tool_result", None)  # after the second turn's result
    assert kinds[at + 1] == ("message", "assistant") or kinds[at + 1] == ("tool_call", None)
    assert [k for k, _ in kinds].count("tool_result") == 3

    # The model saw it at its third turn, right after the tool results, and not before.
    second, third, fourth = (wire_messages(r) for r in upstream.requests[1:4])
    assert not any(STEER in user_texts(m) for m in second if m["role"] == "user")
    for sent in (third, fourth):
        assert_after_tool_results(sent)
    assert sum(STEER in user_texts(m) for m in fourth if m["role"] == "user") == 1


STEER = "also use metric units"


def assert_after_tool_results(sent: list[dict[str, Any]]) -> None:
    """The steered text follows the second turn's tool result directly: in a message of its
    own after it (OpenAI), or after the tool_result blocks of the same user message
    (Anthropic, whose consecutive user turns are one message)."""
    at = next(i for i, m in enumerate(sent) if m["role"] == "user" and STEER in user_texts(m))
    message = sent[at]
    if is_tool_answer(message):
        types = [b["type"] for b in message["content"]]
        last_result = max(i for i, t in enumerate(types) if t == "tool_result")
        assert types.index("text") > last_result
    else:
        assert is_tool_answer(sent[at - 1])
    assert sum(m["role"] == "assistant" for m in sent[:at]) == 2  # after two model turns


async def test_a_run_that_ends_first_hands_the_message_to_the_next_run(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    release = threading.Event()
    upstream.script(Hold(release), Text("first answer"))
    upstream.script(Text("answer to the steer"))
    sid = (await new_session(api))["id"]
    started = await api.post(f"/v1/sessions/{sid}/ask", json={"input": "one", "stream": False})
    run_id = started.json()["id"]
    await upstream.requests_arrived(1)
    _, steer_id = await steer(api, sid, "and two")
    release.set()
    assert (await ended_run(api, run_id))["status"] == "completed"

    events = await collect(api, "GET", f"/v1/runs/{run_id}/events")
    landed = next(e.data for e in events if e.type == "run.steered")
    assert events[-1].type == "run.completed"  # the run.steered event came before its end
    next_run = await ended_run(api, landed["next_run_id"])
    assert next_run["status"] == "completed" and next_run["result"] == "answer to the steer"
    assert next_run["user_entry_seq"] == landed["entry_seq"]
    sent = wire_messages(upstream.requests[1])
    assert [(m["role"], user_texts(m)[0]) for m in sent] == [
        ("user", "one"),
        ("assistant", "first answer"),
        ("user", "and two"),
    ]
    journal = await history(api, sid)
    message = next(e for e in journal if e["seq"] == landed["entry_seq"])
    assert message["refs"] == {"run_id": landed["next_run_id"], "from_steer_id": steer_id}


async def test_a_cancelled_run_keeps_the_message_and_starts_nothing(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    release = threading.Event()
    upstream.script(Hold(release), Text("never finished"))
    sid = (await new_session(api))["id"]
    started = await api.post(f"/v1/sessions/{sid}/ask", json={"input": "one", "stream": False})
    run_id = started.json()["id"]
    await upstream.requests_arrived(1)
    _, steer_id = await steer(api, sid, "wait, stop")
    assert (await api.post(f"/v1/runs/{run_id}/cancel")).status_code in {200, 202}
    release.set()
    assert (await ended_run(api, run_id))["status"] == "cancelled"
    events = await collect(api, "GET", f"/v1/runs/{run_id}/events")
    landed = next(e.data for e in events if e.type == "run.steered")
    assert set(landed) == {"steer_id", "entry_seq", "text"} and landed["steer_id"] == steer_id
    journal = await history(api, sid)
    kept = next(e for e in journal if e["seq"] == landed["entry_seq"])
    assert kept["payload"] == {"role": "user", "content": "wait, stop"}
    assert (await api.get(f"/v1/sessions/{sid}")).json()["status"] == "idle"


async def test_with_no_run_in_progress_a_steer_is_an_ordinary_ask(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    upstream.script(Text("hello"))
    sid = (await new_session(api))["id"]
    body = {"input": "hi", "stream": False, "multitask_strategy": "steer"}
    response = await api.post(f"/v1/sessions/{sid}/ask", json=body)
    assert response.status_code == 202 and "Threadline-Steer-Id" not in response.headers
    assert (await ended_run(api, response.json()["id"]))["result"] == "hello"


async def test_a_steer_sent_twice_with_one_idempotency_key_is_committed_once(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    """A retried steer (the same Idempotency-Key, e.g. after a dropped connection) answers the
    same steer of the same run, and its message reaches the model once."""
    release = threading.Event()
    upstream.script(Hold(release), Text("first answer"))
    upstream.script(Text("answer to the steer"))
    sid = (await new_session(api))["id"]
    started = await api.post(f"/v1/sessions/{sid}/ask", json={"input": "one", "stream": False})
    await upstream.requests_arrived(1)
    body = {"input": "and two", "stream": False, "multitask_strategy": "steer"}
    headers = {"Idempotency-Key": "steer-once"}
    sent = [await api.post(f"/v1/sessions/{sid}/ask", json=body, headers=headers) for _ in "ab"]
    assert [r.status_code for r in sent] == [202, 202], sent[1].text
    steer_ids = {r.headers["Threadline-Steer-Id"] for r in sent}
    assert len(steer_ids) == 1 and {r.json()["id"] for r in sent} == {started.json()["id"]}
    release.set()
    assert (await ended_run(api, started.json()["id"]))["status"] == "completed"
    journal = await history(api, sid)
    users = [e for e in journal if e["kind"] == "message" and e["payload"]["role"] == "user"]
    assert [u["payload"]["content"] for u in users] == ["one", "and two"]
