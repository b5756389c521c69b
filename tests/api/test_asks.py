"""Asking over a real uvicorn: commit, stream, resume, strategies, cancels, failures
(DESIGN invariants 3 and 7)."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import httpx
import pytest

from app.config import Settings
from testkit.api import history, new_session
from testkit.server import free_port
from testkit.sse_client import TERMINAL, Event, collect, events, streamed_ask
from testkit.upstream import FakeUpstream, Text, Usage
from tests.e2e import Process, process_env


def deltas(events: list[Event]) -> str:
    return "".join(e.data["text"] for e in events if e.type == "message.delta")


async def test_ask_streams_and_commits(api: httpx.AsyncClient, upstream: FakeUpstream) -> None:
    sid = (await new_session(api, config={"system_prompt": "Be brief."}))["id"]
    upstream.script(Text("Hello"), Text(", "), Text("world"), Usage(12, 3))
    events = await streamed_ask(api, sid, "Hi there")
    types = [e.type for e in events]
    assert types[0] == "run.created" and types[-1] == "run.completed"
    assert [e.id for e in events] == list(range(1, len(events) + 1))
    assert deltas(events) == "Hello, world"
    assert events[-1].data["text"] == "Hello, world"
    assert events[-1].data["usage"] == {
        "input_tokens": 12,
        "output_tokens": 3,
        "cached_tokens": 0,
        "cache_write_tokens": 0,
        "estimated": False,
    }
    committed = [e.data["kind"] for e in events if e.type == "entry.committed"]
    assert committed == ["message", "usage", "run_end"]
    journal = await history(api, sid)
    assert [(e["kind"], e["payload"].get("role")) for e in journal] == [
        ("message", "user"),
        ("run_start", None),
        ("message", "assistant"),
        ("usage", None),
        ("run_end", None),
    ]
    assert journal[2]["payload"]["content"] == "Hello, world"
    session = (await api.get(f"/v1/sessions/{sid}")).json()
    assert session["status"] == "idle"
    assert session["usage"]["input_tokens"] == 12 and session["usage"]["output_tokens"] == 3
    assert session["usage"]["cost_usd"] > 0  # gpt-4o-mini is priced by genai-prices
    assert session["title"] == "Hi there"  # untitled: named by its first user message

    upstream.script(Text("Again"))
    await streamed_ask(api, sid, "And again")
    sent = upstream.requests[-1].body["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "user"]
    assert sent[2]["content"] == "Hello, world" and sent[3]["content"] == "And again"
    assert (await api.get(f"/v1/sessions/{sid}")).json()["title"] == "Hi there"


async def test_anthropic_sessions_stream_through_the_anthropic_sdk(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = (
        await new_session(api, config={"model": "anthropic:claude-haiku-4-5", "system_prompt": "S"})
    )["id"]
    upstream.script(Text("Bonjour"), Text("!"), Usage(20, 2, 5))
    events = await streamed_ask(api, sid, "Salut")
    assert deltas(events) == "Bonjour!" and events[-1].type == "run.completed"
    assert events[-1].data["usage"]["cached_tokens"] == 5
    received = upstream.requests[-1]
    assert received.path == "/v1/messages"
    # Marked for Anthropic's prompt cache: the system prompt and the last message.
    ephemeral = {"type": "ephemeral"}
    assert received.body["system"] == [{"type": "text", "text": "S", "cache_control": ephemeral}]
    assert received.body["messages"] == [
        {
            "role": "user",
            "content": [{"type": "text", "text": "Salut", "cache_control": ephemeral}],
        }
    ]


async def test_resume_on_another_api_process_is_exactly_once(
    api: httpx.AsyncClient, upstream: FakeUpstream, second_api: str
) -> None:
    sid = (await new_session(api))["id"]
    upstream.script(*[Text(f"t{i} ") for i in range(40)], Usage(5, 40), token_delay=0.02)
    first = await collect(
        api, "POST", f"/v1/sessions/{sid}/ask", json={"input": "count"}, stop_after=5
    )
    run_id = first[0].data["run_id"]
    assert [e.id for e in first] == [1, 2, 3, 4, 5]
    headers = dict(api.headers)
    async with httpx.AsyncClient(base_url=second_api, headers=headers, timeout=30) as other:
        second = await collect(
            other, "GET", f"/v1/runs/{run_id}/events", headers={"Last-Event-ID": "5"}, stop_after=7
        )
        third = await collect(
            other, "GET", f"/v1/runs/{run_id}/events", params={"starting_after": second[-1].id}
        )
        replay = await collect(other, "GET", f"/v1/runs/{run_id}/events")
    seen = first + second + third
    assert [e.id for e in seen] == list(range(1, len(seen) + 1))  # no gap, no duplicate
    assert seen == replay  # exactly the run's events
    assert seen[-1].type == "run.completed"
    assert deltas(seen) == "".join(f"t{i} " for i in range(40))


async def test_disconnect_is_not_cancel(api: httpx.AsyncClient, upstream: FakeUpstream) -> None:
    sid = (await new_session(api))["id"]
    upstream.script(*[Text("x") for _ in range(20)], token_delay=0.02)
    first = await collect(
        api, "POST", f"/v1/sessions/{sid}/ask", json={"input": "go"}, stop_after=3
    )
    run = (await api.get(f"/v1/runs/{first[0].data['run_id']}", params={"wait": "true"})).json()
    assert run["status"] == "completed" and run["result"] == "x" * 20


async def test_on_disconnect_cancel(api: httpx.AsyncClient, upstream: FakeUpstream) -> None:
    sid = (await new_session(api))["id"]
    upstream.script(*[Text("y") for _ in range(200)], token_delay=0.02)
    body = {"input": "go", "on_disconnect": "cancel"}
    first = await collect(api, "POST", f"/v1/sessions/{sid}/ask", json=body, stop_after=4)
    run = (await api.get(f"/v1/runs/{first[0].data['run_id']}", params={"wait": "true"})).json()
    assert run["status"] == "cancelled"


async def test_cancel_commits_the_partial_answer(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = (await new_session(api))["id"]
    upstream.script(*[Text("z") for _ in range(300)], token_delay=0.02)
    response = await api.post(f"/v1/sessions/{sid}/ask", json={"input": "go", "stream": False})
    assert response.status_code == 202
    run_id = response.json()["id"]
    partial = await collect(api, "GET", f"/v1/runs/{run_id}/events", stop_after=4)
    assert any(e.type == "message.delta" for e in partial)
    assert (await api.post(f"/v1/runs/{run_id}/cancel")).status_code == 200
    events = await collect(api, "GET", f"/v1/runs/{run_id}/events")
    assert events[-1].type == "run.cancelled"
    assert [e.type for e in events].count("run.cancelled") == 1
    journal = await history(api, sid)
    answer = next(e for e in journal if e["payload"].get("role") == "assistant")
    assert answer["payload"]["status"] == "incomplete"
    assert answer["payload"]["content"] == events[-1].data["partial_text"] != ""
    assert journal[-1]["kind"] == "run_end" and journal[-1]["payload"]["status"] == "cancelled"
    again = await api.post(f"/v1/runs/{run_id}/cancel")
    assert again.json()["status"] == "cancelled"  # cancelling an ended run changes nothing


async def test_background_ask_and_wait(api: httpx.AsyncClient, upstream: FakeUpstream) -> None:
    sid = (await new_session(api))["id"]
    upstream.script(Text("later"), token_delay=0.05)
    queued = (
        await api.post(f"/v1/sessions/{sid}/ask", json={"input": "q", "stream": False})
    ).json()
    assert queued["status"] in ("queued", "running")
    done = (
        await api.get(f"/v1/runs/{queued['id']}", params={"wait": "true", "timeout": 20})
    ).json()
    assert done["status"] == "completed" and done["result"] == "later"
    assert (await api.get(f"/v1/sessions/{sid}/stream")).status_code == 204


async def test_join_the_active_run(api: httpx.AsyncClient, upstream: FakeUpstream) -> None:
    sid = (await new_session(api))["id"]
    upstream.script(*[Text("j") for _ in range(30)], token_delay=0.03)
    queued = (
        await api.post(f"/v1/sessions/{sid}/ask", json={"input": "q", "stream": False})
    ).json()
    joined = await collect(api, "GET", f"/v1/sessions/{sid}/stream")
    assert joined[0].type == "run.created" and joined[0].data["run_id"] == queued["id"]
    assert joined[-1].type == "run.completed" and deltas(joined) == "j" * 30


async def test_idempotent_ask(api: httpx.AsyncClient, upstream: FakeUpstream) -> None:
    sid = (await new_session(api))["id"]
    upstream.script(Text("once"))
    headers = {"Idempotency-Key": "ask-1"}
    body = {"input": "hello", "stream": False}
    first = (await api.post(f"/v1/sessions/{sid}/ask", json=body, headers=headers)).json()
    again = (await api.post(f"/v1/sessions/{sid}/ask", json=body, headers=headers)).json()
    assert first["id"] == again["id"]
    await api.get(f"/v1/runs/{first['id']}", params={"wait": "true"})
    users = [e for e in await history(api, sid) if e["payload"].get("role") == "user"]
    assert len(users) == 1
    assert len([r for r in upstream.requests]) == 1
    empty = await api.post(f"/v1/sessions/{sid}/ask", json=body, headers={"Idempotency-Key": ""})
    assert empty.status_code == 422  # an empty key would make every keyless retry "the same"


async def test_concurrent_asks_with_one_idempotency_key_make_one_run(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    """Retries racing each other: every one answers with the same run, and the losers of the
    race left nothing behind (no user entry, no second job, no second run)."""
    sid = (await new_session(api))["id"]
    upstream.script(Text("once"), Usage(3, 2))
    headers = {"Idempotency-Key": "raced"}
    body = {"input": "hello", "stream": False, "multitask_strategy": "enqueue"}
    answers = await asyncio.gather(
        *(api.post(f"/v1/sessions/{sid}/ask", json=body, headers=headers) for _ in range(6))
    )
    assert {a.status_code for a in answers} == {202}
    (run_id,) = {a.json()["id"] for a in answers}
    await api.get(f"/v1/runs/{run_id}", params={"wait": "true"})
    kinds = Counter(e["kind"] for e in await history(api, sid))
    assert kinds == {"message": 2, "run_start": 1, "usage": 1, "run_end": 1}
    assert len(upstream.requests) == 1


async def test_rejections_leave_the_journal_untouched(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = (await new_session(api))["id"]
    upstream.script(*[Text("busy") for _ in range(50)], token_delay=0.02)
    running = (
        await api.post(f"/v1/sessions/{sid}/ask", json={"input": "first", "stream": False})
    ).json()
    before = await history(api, sid)
    busy = await api.post(f"/v1/sessions/{sid}/ask", json={"input": "second"})
    assert busy.status_code == 409 and busy.json()["error"]["code"] == "session_busy"
    assert busy.json()["error"]["details"]["active_run_id"] == running["id"]
    bad = await api.post(f"/v1/sessions/{sid}/ask", json={"input": "x", "temperature": 9})
    assert bad.status_code == 422
    huge = await api.post(
        f"/v1/sessions/{sid}/ask",
        json={"input": "w " * 4000, "context_policy": {"max_input_tokens": 1000}},
    )
    assert huge.status_code == 422 and huge.json()["error"]["code"] == "context_overflow"
    bad_policy = await api.post(
        f"/v1/sessions/{sid}/ask", json={"input": "x", "context_policy": {"max_input_tokens": 5}}
    )
    assert bad_policy.status_code == 422
    assert await history(api, sid) == before
    await api.post(f"/v1/runs/{running['id']}/cancel")
    # Ended before the next test: a run cancelled before its model call may still make it,
    # and the next test's upstream would count it (on a loaded machine it may even finish).
    ended = await api.get(f"/v1/runs/{running['id']}", params={"wait": "true", "timeout": 60})
    assert ended.json()["status"] in {"cancelled", "completed"}


async def test_enqueue_runs_after_the_active_run(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = (await new_session(api))["id"]
    upstream.script(*[Text("a") for _ in range(10)], token_delay=0.03)
    upstream.script(Text("b"))
    first = (
        await api.post(f"/v1/sessions/{sid}/ask", json={"input": "one", "stream": False})
    ).json()
    second = await streamed_ask(api, sid, "two", multitask_strategy="enqueue")
    assert second[-1].type == "run.completed" and deltas(second) == "b"
    first_run = (await api.get(f"/v1/runs/{first['id']}")).json()
    assert (
        first_run["status"] == "completed"
        and first_run["ended_at"]
        <= (await api.get(f"/v1/runs/{second[0].data['run_id']}")).json()["started_at"]
    )
    # They never overlapped: the second run saw the first exchange in order, though "two" was
    # committed before the first answer; the first run never saw "two".
    sent = [[m["content"] for m in r.body["messages"]] for r in upstream.requests]
    assert sent == [["one"], ["one", "a" * 10, "two"]]


async def test_interrupt_cancels_and_runs(api: httpx.AsyncClient, upstream: FakeUpstream) -> None:
    sid = (await new_session(api))["id"]
    upstream.script(*[Text("a") for _ in range(300)], token_delay=0.02)
    upstream.script(Text("new answer"))
    first = (
        await api.post(f"/v1/sessions/{sid}/ask", json={"input": "one", "stream": False})
    ).json()
    await collect(api, "GET", f"/v1/runs/{first['id']}/events", stop_after=3)
    second = await streamed_ask(api, sid, "two", multitask_strategy="interrupt")
    assert deltas(second) == "new answer"
    first_run = (await api.get(f"/v1/runs/{first['id']}")).json()
    assert first_run["status"] == "cancelled" and first_run["cancel_mode"] == "interrupt"


async def test_rollback_takes_the_cancelled_run_out_of_the_context(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = (await new_session(api))["id"]
    upstream.script(Text("kept"))
    await streamed_ask(api, sid, "zero")
    upstream.script(*[Text("a") for _ in range(300)], token_delay=0.02)
    upstream.script(Text("fresh"))
    first = (
        await api.post(f"/v1/sessions/{sid}/ask", json={"input": "one", "stream": False})
    ).json()
    await collect(api, "GET", f"/v1/runs/{first['id']}/events", stop_after=3)
    second = await streamed_ask(api, sid, "two", multitask_strategy="rollback")
    assert deltas(second) == "fresh"
    assert [m["content"] for m in upstream.requests[-1].body["messages"]] == ["zero", "kept", "two"]
    journal = await history(api, sid)
    rollback = next(e for e in journal if e["kind"] == "rollback")
    assert rollback["payload"]["from_seq"] == first["user_entry_seq"]
    assert any(e["payload"].get("content") == "one" for e in journal)  # history keeps it


@pytest.mark.slow
async def test_an_api_process_killed_mid_stream_loses_nothing(
    api: httpx.AsyncClient, upstream: FakeUpstream, e2e_settings: Settings
) -> None:
    """kill -9 of the API process a client streams an ask from: the run goes on (its workers
    are elsewhere), and the client resumes on another API process exactly after what it saw."""
    port = free_port()
    env = process_env(e2e_settings, worker_concurrency=0, port=port)
    doomed = Process(["serve", "--port", str(port)], env, f"http://127.0.0.1:{port}/readyz")
    sid = (await new_session(api))["id"]
    upstream.script(*[Text(f"t{i} ") for i in range(60)], Usage(5, 60), token_delay=0.02)
    first: list[Event] = []
    try:
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}", headers=dict(api.headers), timeout=30
        ) as first_api:
            url = f"/v1/sessions/{sid}/ask"
            with pytest.raises(httpx.HTTPError):  # the connection dies with the process
                async with first_api.stream("POST", url, json={"input": "count"}) as response:
                    async for event in events(response):
                        first.append(event)
                        if len(first) == 5:
                            doomed.kill()  # mid-stream: the client is still reading
    finally:
        doomed.stop()
    run_id = first[0].data["run_id"]
    rest = await collect(
        api, "GET", f"/v1/runs/{run_id}/events", headers={"Last-Event-ID": str(first[-1].id)}
    )
    seen = first + rest
    assert [e.id for e in seen] == list(range(1, len(seen) + 1))
    assert [e.type for e in seen if e.type in TERMINAL] == ["run.completed"]
    assert deltas(seen) == "".join(f"t{i} " for i in range(60))
    upstream.script(Text("next"))
    nxt = await collect(api, "POST", f"/v1/sessions/{sid}/ask", json={"input": "again"})
    assert nxt[-1].type == "run.completed" and deltas(nxt) == "next"


@pytest.mark.parametrize("model", ["openai:gpt-4o-mini", "anthropic:claude-haiku-4-5"])
async def test_a_lone_surrogate_from_the_model_is_stored_replaced(
    api: httpx.AsyncClient, upstream: FakeUpstream, model: str
) -> None:
    """A provider's JSON may escape a lone surrogate or a NUL; Postgres cannot store one, so
    the answer (and the run's end) could never be written. It arrives as U+FFFD instead."""
    sid = (await new_session(api))["id"]
    upstream.script(Text("a\ud800b"), Text(" o\x00k"))
    seen = await collect(
        api, "POST", f"/v1/sessions/{sid}/ask", json={"input": "go", "model": model}
    )
    assert seen[-1].type == "run.completed"
    assert deltas(seen) == "a\ufffdb o\ufffdk" == seen[-1].data["text"]
    answer = (await history(api, sid))[-3]
    assert answer["payload"]["content"] == "a\ufffdb o\ufffdk"


CALCULATOR = {"name": "calculator", "kind": "builtin"}


@pytest.mark.parametrize(
    ("config", "body", "problem"),
    [
        ({"tools": [CALCULATOR]}, {"tool_choice": {"type": "function", "name": "x"}}, "'x'"),
        ({}, {"tool_choice": "required"}, "needs at least one tool"),
        ({}, {"tool_choice": {"type": "function", "name": "calculator"}}, "(none)"),
        (
            {"tools": [CALCULATOR], "model": "local:smollm2"},
            {"tool_choice": "required"},
            "local models never call tools",
        ),
        (
            {"tools": [CALCULATOR]},
            {"tool_choice": {"type": "function", "name": "calculator"}, "model": "local:x"},
            "local models never call tools",
        ),
    ],
)
async def test_a_tool_choice_the_run_cannot_serve_is_refused_and_writes_nothing(
    api: httpx.AsyncClient, config: dict[str, Any], body: dict[str, Any], problem: str
) -> None:
    sid = (await new_session(api, config=config))["id"]

    refused = await api.post(f"/v1/sessions/{sid}/ask", json={"input": "2 + 2?", **body})

    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert error["code"] == "invalid_tool_choice" and problem in error["message"]
    assert error["details"]["loc"] == ["body", "tool_choice"]
    assert await history(api, sid) == []


@pytest.mark.parametrize(
    "choice",
    [
        "any",
        "",
        None,
        3,
        {"type": "function"},
        {"type": "function", "name": ""},
        {"type": "function", "name": "calc ulator"},
        {"type": "function", "function": {"name": "calculator"}},
        {"type": "function", "name": "calculator", "strict": True},
        {"type": "tool", "name": "calculator"},
    ],
)
async def test_a_malformed_tool_choice_is_a_validation_error(
    api: httpx.AsyncClient, choice: Any
) -> None:
    sid = (await new_session(api, config={"tools": [CALCULATOR]}))["id"]

    refused = await api.post(f"/v1/sessions/{sid}/ask", json={"input": "x", "tool_choice": choice})

    assert refused.status_code == 422
    assert refused.json()["error"]["code"] == "validation_error"
    bad_parallel = await api.post(
        f"/v1/sessions/{sid}/ask", json={"input": "x", "parallel_tool_calls": "no"}
    )
    assert bad_parallel.status_code == 422
    assert await history(api, sid) == []


async def test_a_named_tool_may_be_one_the_ask_brings(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = (await new_session(api))["id"]
    upstream.script(Text("fine"))

    events = await streamed_ask(
        api,
        sid,
        "2 + 2?",
        tools=[CALCULATOR],
        tool_choice={"type": "function", "name": "calculator"},
    )

    assert events[-1].type == "run.completed"
    sent = upstream.requests[-1].body["tool_choice"]
    assert sent == {"type": "function", "function": {"name": "calculator"}}


async def test_the_session_sets_the_answer_length_and_temperature_an_ask_may_override(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    """Per session, not only per ask: a small local model's defaults (256 tokens, greedy) are
    for it to lift, and any model's for it to set."""
    config = {"max_output_tokens": 40, "temperature": 0.7}
    sid = (await new_session(api, config=config))["id"]
    upstream.script(Text("one"))
    await streamed_ask(api, sid, "first")
    sent = upstream.requests[-1].body
    assert sent["max_completion_tokens"] == 40 and sent["temperature"] == 0.7
    upstream.script(Text("two"))
    await streamed_ask(api, sid, "second", max_output_tokens=12, temperature=0)
    sent = upstream.requests[-1].body
    assert sent["max_completion_tokens"] == 12 and sent["temperature"] == 0
    patched = await api.patch(f"/v1/sessions/{sid}", json={"config": {"temperature": None}})
    assert patched.status_code == 200, patched.text
    upstream.script(Text("three"))
    await streamed_ask(api, sid, "third")
    sent = upstream.requests[-1].body
    assert sent["max_completion_tokens"] == 40 and "temperature" not in sent
    bad = await api.post("/v1/sessions", json={"config": {"temperature": 3}})
    assert bad.status_code == 422
