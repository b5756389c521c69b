"""Runs against provider failures: retries, clear failures once they run out, and the user's
words kept whatever happens (DESIGN invariant 3). Faults after output began:
tests/worker/test_provider_faults.py."""

from __future__ import annotations

import httpx

from testkit.api import history, new_session
from testkit.sse_client import collect, streamed_ask
from testkit.upstream import Fail, FailMidStream, FakeUpstream, Stall, Text, Usage


async def test_rate_limit_before_output_is_retried(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = (await new_session(api))["id"]
    upstream.script(Fail(429, "rate_limit"))
    upstream.script(Fail(529, "overloaded"))
    upstream.script(Text("made it"), Usage(3, 2))
    events = await streamed_ask(api, sid, "hello")
    assert events[-1].type == "run.completed" and events[-1].data["text"] == "made it"
    assert len(upstream.requests) == 3


async def test_a_rejected_request_fails_clearly_and_keeps_the_users_words(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = (await new_session(api))["id"]
    upstream.script(Fail(400, "bad_request", "nope"))
    events = await streamed_ask(api, sid, "my words")
    assert events[-1].type == "run.failed"
    assert events[-1].data["error"]["code"] == "provider_bad_request"
    assert len(upstream.requests) == 1  # not retried
    journal = await history(api, sid)
    assert journal[0]["payload"] == {"role": "user", "content": "my words"}
    assert journal[-1]["kind"] == "run_end" and journal[-1]["payload"]["status"] == "failed"
    assert (await api.get(f"/v1/sessions/{sid}")).json()["status"] == "idle"


async def test_failure_after_output_commits_the_partial_answer(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = (await new_session(api))["id"]
    for _ in range(4):  # the first try and 3 retries, each failing after its output began
        upstream.script(Text("half "), Text("an answer"), FailMidStream("overloaded"))
    events = await streamed_ask(api, sid, "go")
    assert events[-1].type == "run.failed"
    assert events[-1].data["error"]["code"] == "provider_overloaded"
    assert events[-1].data["partial_text"] == "half an answer"
    assert len(upstream.requests) == 4
    run_id = events[0].data["run_id"]
    answer = next(
        e
        for e in await history(api, sid)
        if e["refs"] == {"run_id": run_id, "context_from": 1}
        and e["payload"].get("role") == "assistant"
    )
    assert answer["payload"] == {
        "role": "assistant",
        "content": "half an answer",
        "status": "incomplete",
    }
    run = (await api.get(f"/v1/runs/{run_id}")).json()
    assert run["status"] == "failed" and run["result"] == "half an answer"


async def test_exhausted_retries_fail_the_run(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = (await new_session(api))["id"]
    for _ in range(4):
        upstream.script(Fail(500, "server"))
    events = await streamed_ask(api, sid, "hello")
    assert events[-1].type == "run.failed" and events[-1].data["error"]["code"] == "provider_server"
    assert len(upstream.requests) == 4  # the first try and 3 retries


async def test_fallback_model_answers_when_the_primary_fails(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    config = {"model": "openai:gpt-4o-mini", "fallback_model": "anthropic:claude-haiku-4-5"}
    sid = (await new_session(api, config=config))["id"]
    upstream.script(Fail(401, "auth"))
    upstream.script(Text("from the fallback"))
    events = await streamed_ask(api, sid, "hello")
    assert (
        events[-1].type == "run.completed"
        and events[-1].data["model"] == "anthropic:claude-haiku-4-5"
    )
    assert [r.path for r in upstream.requests] == ["/v1/chat/completions", "/v1/messages"]


async def test_a_stalled_model_is_cancelled_promptly(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = (await new_session(api))["id"]
    upstream.script(Text("first"), Stall(30), Text("never"))
    started = await collect(
        api, "POST", f"/v1/sessions/{sid}/ask", json={"input": "go"}, stop_after=3
    )
    run_id = started[0].data["run_id"]
    await api.post(f"/v1/runs/{run_id}/cancel")
    run = (await api.get(f"/v1/runs/{run_id}", params={"wait": "true", "timeout": 10})).json()
    assert run["status"] == "cancelled" and run["result"] == "first"


async def test_heartbeats_keep_an_idle_stream_alive(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = (await new_session(api))["id"]
    upstream.script(Text("a"), Stall(2.5), Text("b"))
    comments, types = 0, []
    async with api.stream("POST", f"/v1/sessions/{sid}/ask", json={"input": "go"}) as response:
        async for line in response.aiter_lines():
            if line.startswith(":"):
                comments += 1
            elif line.startswith("event:"):
                types.append(line.split(":", 1)[1].strip())
                if types[-1] == "run.completed":
                    break
    assert comments >= 1  # heartbeats every second in these tests (15 s by default)


async def test_a_nearly_full_context_warns(api: httpx.AsyncClient, upstream: FakeUpstream) -> None:
    sid = (await new_session(api))["id"]
    upstream.script(Text("ok"))
    policy = {"max_input_tokens": 1000, "reserve_output_tokens": 100}
    events = await collect(
        api,
        "POST",
        f"/v1/sessions/{sid}/ask",
        json={"input": "word " * 760, "context_policy": policy},
    )
    warning = next(e for e in events if e.type == "context.warning")
    assert warning.data["level"] == "approaching_limit" and warning.data["budget"] == 900
    assert 80 <= warning.data["percent"] < 100
