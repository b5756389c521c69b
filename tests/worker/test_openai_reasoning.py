"""OpenAI reasoning end to end, through the served app and the real openai SDK to the fake
upstream: reasoning models on the Responses API (encrypted reasoning items journaled byte for
byte in their place, sent back within their tool loop, summaries streamed as
`reasoning.delta`; the fake refuses, as the API does, items missing, reordered or altered), and
OpenAI-compatible servers' readable reasoning (journaled, streamed, never sent back)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import openai
import pytest

from app.config import Settings
from app.db.engine import create_engine
from app.main import create_app
from app.services.keys import create_key
from testkit.api import history, new_session
from testkit.server import serve_in_thread, stop_thread_server
from testkit.sse_client import Event, streamed_ask
from testkit.upstream import (
    Chunk,
    FailMidStream,
    FakeUpstream,
    ReasoningContent,
    RedactedThinking,
    Text,
    Thinking,
    ToolCall,
    Usage,
    sealed_reasoning,
)
from tests.e2e import create_database, e2e_env

MODEL = "openai:o4-mini"
CALCULATOR = {
    "name": "calculator",
    "kind": "builtin",
    "description": "Arithmetic",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
}
CONFIG = {"model": MODEL, "tools": [CALCULATOR], "reasoning": {"effort": "medium"}}
COMPAT = "compat:thinker"
ITERATIONS = 4
ODD = "  \t\u00e9\u2603\U0001f914 \n"  # kept byte for byte


@pytest.fixture(scope="module")
def served(database_url: str, upstream: FakeUpstream) -> Iterator[tuple[str, Settings]]:
    """`threadline serve` with OpenAI (Responses for its reasoning models) and a compat
    endpoint that reasons, both on the fake upstream."""
    settings = Settings(
        _env_file=None,
        database_url=create_database(database_url, "openai_reasoning"),
        db_pool_size=5,
        compat_endpoints={"thinker": {"url": upstream.openai_base_url, "reasoning": True}},
        **e2e_env(upstream),
    )
    server, thread, url = serve_in_thread(create_app(settings, workers=2))
    yield url, settings
    stop_thread_server(server, thread)


@pytest.fixture
async def api(
    served: tuple[str, Settings], upstream: FakeUpstream
) -> AsyncIterator[httpx.AsyncClient]:
    url, settings = served
    upstream.clear()
    engine = create_engine(settings)
    try:
        key = await create_key(engine, f"openai-reasoning-{uuid.uuid4()}")
    finally:
        await engine.dispose()
    async with httpx.AsyncClient(
        base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60
    ) as client:
        yield client


def item(at: int, text: str, place: int = 0, of: int = 1, summarized: bool = True) -> Any:
    """The reasoning part the fake's reasoning item at output index `at` becomes."""
    said = [{"type": "summary_text", "text": text}] if summarized else []
    return {
        "type": "reasoning",
        "id": f"rs_fake{at}",
        "encrypted_content": sealed_reasoning(f"rs_fake{at}", text, place, of),
        "summary": said,
    }


def wire(part: dict[str, Any]) -> dict[str, Any]:
    return {k: part[k] for k in ("type", "id", "summary", "encrypted_content")}


def assistants(journal: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in journal if e["kind"] == "message" and e["payload"]["role"] == "assistant"]


def items_sent(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [i for i in body["input"] if i.get("type") == "reasoning"]


def blocks_streamed(events: list[Event]) -> dict[tuple[int, int], dict[str, Any]]:
    """reasoning.delta events folded per (model turn, block index): text, start, end."""
    blocks: dict[tuple[int, int], dict[str, Any]] = {}
    turn = 0
    for event in events:
        if event.type == "tool_result":
            turn += 1
        if event.type != "reasoning.delta":
            continue
        block = blocks.setdefault((turn, event.data["index"]), {"text": ""})
        block["text"] += event.data["text"]
        for flag in ("start", "end"):
            if event.data.get(flag):
                block[flag] = block.get(flag, 0) + 1
    return blocks


async def test_a_tool_loop_on_the_responses_upstream_keeps_its_reasoning(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = (await new_session(api, config=CONFIG))["id"]
    for i in range(ITERATIONS):
        steps: list[Any] = [Thinking(f"Step {i}: add one.{ODD}"), Text(f"Adding {i}.")]
        if i % 2:  # some turns reason twice, once without a summary
            steps.insert(1, RedactedThinking(f"unsummarized {i}"))
        upstream.script(*steps, ToolCall(f"call_{i}", "calculator", f'{{"expression": "{i}+1"}}'))
    upstream.script(Thinking("All done."), Text("The sums are done."), Usage(40, 90, reasoning=70))

    events = await streamed_ask(api, sid, "Add one, four times.")

    assert events[-1].type == "run.completed", events[-1].data
    assert events[-1].data["text"] == "The sums are done."
    assert [e.type for e in events].count("tool_result") == ITERATIONS
    # Journaled: each model turn one assistant message, its reasoning items byte for byte in
    # their place among its text, then its call.
    turns = assistants(await history(api, sid))
    assert len(turns) == ITERATIONS + 1
    expected: list[list[dict[str, Any]]] = []
    for i in range(ITERATIONS):
        parts = [item(0, f"Step {i}: add one.{ODD}", 0, 1 + i % 2)]
        if i % 2:
            parts.append(item(1, f"unsummarized {i}", 1, 2, summarized=False))
        expected.append(parts)
        text = {"type": "text", "text": f"Adding {i}."}
        assert turns[i]["payload"]["content"] == [*parts, text]
    assert turns[-1]["payload"]["content"] == [
        item(0, "All done."),
        {"type": "text", "text": "The sums are done."},
    ]
    # Every request: stateless, asking for the encrypted content and a summary; each sent the
    # loop's earlier items back unchanged and in order (the fake, as OpenAI, accepted each).
    bodies = [r.body for r in upstream.requests]
    assert [r.path for r in upstream.requests] == ["/v1/responses"] * (ITERATIONS + 1)
    for n, body in enumerate(bodies):
        assert body["store"] is False
        assert body["include"] == ["reasoning.encrypted_content"]
        assert body["reasoning"] == {"effort": "medium", "summary": "auto"}
        assert items_sent(body) == [wire(p) for turn in expected[:n] for p in turn]
        assert body["tools"][0]["type"] == "function" and body["tools"][0]["name"] == "calculator"
    kinds = [i.get("type", i.get("role")) for i in bodies[2]["input"]]
    assert kinds[:5] == ["user", "reasoning", "assistant", "function_call", "function_call_output"]
    # Summaries streamed as reasoning, apart from the answer, each block started and ended once.
    blocks = blocks_streamed(events)
    assert blocks[(0, 0)]["text"] == f"Step 0: add one.{ODD}"
    assert blocks[(1, 1)] == {"text": "", "start": 1, "end": 1}
    assert all(b["start"] == 1 and b["end"] == 1 for b in blocks.values())
    answer = "".join(e.data["text"] for e in events if e.type == "message.delta")
    assert "Step" not in answer
    usage = next(e.data for e in events if e.type == "usage")
    assert usage["reasoning_tokens"] >= 70

    # The next ask ends the loop: earlier turns' items are not sent back.
    upstream.script(Text("You are welcome."))
    after = await streamed_ask(api, sid, "Thanks")
    assert after[-1].type == "run.completed", after[-1].data
    assert items_sent(upstream.requests[-1].body) == []


async def test_the_fake_refuses_reasoning_items_missing_reordered_or_altered(
    upstream: FakeUpstream,
) -> None:
    """The check the service must pass is real (through the openai SDK, as the service calls)."""
    upstream.clear()
    client = openai.AsyncOpenAI(api_key="sk-test", base_url=upstream.openai_base_url)
    first, second = item(0, "One.", 0, 2), item(1, "Two.", 1, 2)
    call = {"type": "function_call", "call_id": "c1", "name": "calculator", "arguments": "{}"}
    output = {"type": "function_call_output", "call_id": "c1", "output": "2"}
    user = {"role": "user", "content": "1+1?"}
    refused: dict[str, Any] = {
        "missing": [user, call, output],
        "reordered": [user, wire(second), wire(first), call, output],
        "altered": [user, {**wire(first), "encrypted_content": wire(second)["encrypted_content"]}],
        "partial": [user, wire(second), call, output],
    }
    thinking: Any = {"effort": "low", "summary": "auto"}
    accepted_input: Any = [user, wire(first), wire(second), call, output]
    try:
        for what, given in refused.items():
            with pytest.raises(openai.BadRequestError) as refusal:
                await client.responses.create(
                    model="o4-mini",
                    input=given,
                    stream=True,
                    store=False,
                    reasoning=thinking,
                )
            assert refusal.value.status_code == 400, what
            assert refusal.value.type == "invalid_request_error", what
        accepted = await client.responses.create(
            model="o4-mini",
            input=accepted_input,
            stream=True,
            store=False,
            reasoning=thinking,
        )
        async with accepted:
            assert [e.type async for e in accepted][-1] == "response.completed"
    finally:
        await client.close()


async def test_an_altered_item_fails_the_run_clearly(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = (await new_session(api, config=CONFIG))["id"]
    tampered = {**item(0, "I think."), "encrypted_content": sealed_reasoning("rs_x", "Hm", 0, 1)}
    upstream.script(
        Chunk({"type": "response.output_item.done", "output_index": 0, "item": tampered}),
        ToolCall("call_1", "calculator", '{"expression": "1+1"}'),
    )

    events = await streamed_ask(api, sid, "One plus one?")

    assert events[-1].type == "run.failed"
    assert events[-1].data["error"]["code"] == "provider_bad_request"
    assert "could not be verified" in events[-1].data["error"]["message"]


async def test_a_fault_mid_reasoning_is_retried_and_no_half_item_is_journaled(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = (await new_session(api, config=CONFIG))["id"]
    opened = {"id": "rs_half", "type": "reasoning", "summary": []}
    where = {"item_id": "rs_half", "output_index": 0, "summary_index": 0}
    upstream.script(
        Chunk({"type": "response.output_item.added", "output_index": 0, "item": opened}),
        Chunk({"type": "response.reasoning_summary_text.delta", **where, "delta": "Half a thou"}),
        FailMidStream("server", "The server had an error"),
    )
    upstream.script(
        Thinking("A whole thought."), ToolCall("call_1", "calculator", '{"expression": "1+1"}')
    )
    upstream.script(Thinking("Two."), Text("It is 2."))

    events = await streamed_ask(api, sid, "One plus one?")

    assert events[-1].type == "run.completed", events[-1].data
    types = [e.type for e in events]
    reset = types.index("message.reset")
    assert "reasoning.delta" in types[:reset]  # the half thought was streamed, then voided
    journal = await history(api, sid)
    assert "Half a thou" not in repr([e["payload"] for e in journal])
    assert "rs_half" not in repr([e["payload"] for e in journal])
    turns = assistants(journal)
    assert turns[0]["payload"]["content"] == [item(0, "A whole thought.")]
    assert turns[1]["payload"]["content"] == [item(0, "Two."), {"type": "text", "text": "It is 2."}]
    assert upstream.requests[0].body == upstream.requests[1].body
    assert items_sent(upstream.requests[2].body) == [wire(item(0, "A whole thought."))]


async def test_a_fork_inside_a_reasoning_turn(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = (await new_session(api, config=CONFIG))["id"]
    upstream.script(
        Thinking("Compute it."),
        Text("Computing."),
        ToolCall("call_1", "calculator", '{"expression": "2*3"}'),
    )
    upstream.script(Thinking("Six."), Text("It is 6."))
    assert (await streamed_ask(api, sid, "Two times three?"))[-1].type == "run.completed"
    parent = await history(api, sid)
    result = next(e for e in parent if e["kind"] == "tool_result")

    response = await api.post(f"/v1/sessions/{sid}/fork", json={"at_seq": result["seq"]})
    assert response.status_code == 201, response.text
    child = response.json()["id"]
    assert await history(api, child) == [e for e in parent if e["seq"] <= result["seq"]]
    # /projection shows what is sent: the loop's item, in its place, in the Responses shape.
    projected = await api.post(
        f"/v1/sessions/{child}/projection", json={"format": "openai_responses"}
    )
    assert projected.status_code == 200, projected.text
    assert projected.json()["request"]["input"][1] == wire(item(0, "Compute it."))
    # The child's next ask continues the loop left without an answer: its item goes back.
    upstream.script(Thinking("Fresh."), Text("Hello from the fork."))
    events = await streamed_ask(api, child, "Now say hello.")
    assert events[-1].type == "run.completed", events[-1].data
    assert items_sent(upstream.requests[-1].body) == [wire(item(0, "Compute it."))]
    upstream.script(Text("Bye."))
    assert (await streamed_ask(api, child, "Bye"))[-1].type == "run.completed"
    assert items_sent(upstream.requests[-1].body) == []
    assert await history(api, sid) == parent


async def test_compat_reasoning_content_is_journaled_streamed_and_not_sent_back(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    config = {"model": COMPAT, "tools": [CALCULATOR], "reasoning": {"effort": "low"}}
    sid = (await new_session(api, config=config))["id"]
    upstream.script(
        ReasoningContent(f"Let me add.{ODD}"),
        Text("Adding."),
        ToolCall("call_1", "calculator", '{"expression": "1+1"}'),
    )
    upstream.script(ReasoningContent("It is two.", field="reasoning"), Text("2."))

    events = await streamed_ask(api, sid, "One plus one?")

    assert events[-1].type == "run.completed", events[-1].data
    turns = assistants(await history(api, sid))
    assert turns[0]["payload"]["content"] == [
        {"type": "reasoning_text", "text": f"Let me add.{ODD}"},
        {"type": "text", "text": "Adding."},
    ]
    assert turns[1]["payload"]["content"] == [
        {"type": "reasoning_text", "text": "It is two."},
        {"type": "text", "text": "2."},
    ]
    blocks = blocks_streamed(events)
    assert blocks[(0, 0)] == {"text": f"Let me add.{ODD}", "start": 1, "end": 1}
    assert blocks[(1, 0)] == {"text": "It is two.", "start": 1, "end": 1}
    # Never sent back (the fake, as DeepSeek, would refuse it): not even within the loop.
    assert all(r.path == "/v1/chat/completions" for r in upstream.requests)
    second = upstream.requests[1].body["messages"]
    assert second[1] == {
        "role": "assistant",
        "content": "Adding.",
        "tool_calls": second[1]["tool_calls"],
    }
    assert "Let me add" not in repr(upstream.requests[1].body)


async def test_the_fake_refuses_reasoning_content_sent_back(upstream: FakeUpstream) -> None:
    upstream.clear()
    client = openai.AsyncOpenAI(api_key="sk-test", base_url=upstream.openai_base_url)
    said: Any = {"role": "assistant", "content": "2.", "reasoning_content": "It is two."}
    try:
        with pytest.raises(openai.BadRequestError) as refusal:
            await client.chat.completions.create(
                model="deepseek-reasoner",
                messages=[
                    {"role": "user", "content": "1+1?"},
                    said,
                    {"role": "user", "content": "?"},
                ],
                stream=True,
            )
    finally:
        await client.close()
    assert refusal.value.status_code == 400
    assert "reasoning_content" in refusal.value.message


async def test_reasoning_tokens_are_kept_apart_on_the_run_the_session_and_tenant_usage(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = (await new_session(api, config={"model": MODEL}))["id"]
    upstream.script(Thinking("Hm."), Text("Done."), Usage(20, 50, reasoning=42))
    upstream.script(Thinking("Again."), Text("Done again."), Usage(30, 60, reasoning=8))

    first = await streamed_ask(api, sid, "Think.")
    second = await streamed_ask(api, sid, "Once more.")

    runs = [(await api.get(f"/v1/runs/{e[-1].data['run_id']}")).json() for e in (first, second)]
    assert [r["usage"]["reasoning_tokens"] for r in runs] == [42, 8]
    assert [r["usage"]["output_tokens"] for r in runs] == [50, 60]  # reasoning included
    session = (await api.get(f"/v1/sessions/{sid}")).json()
    assert session["usage"]["reasoning_tokens"] == 50
    assert session["usage"]["output_tokens"] == 110
    report = (await api.get("/v1/usage")).json()
    (day,) = [d for d in report["data"] if d["model"] == MODEL]
    assert day["reasoning_tokens"] == 50 and day["output_tokens"] == 110
    assert report["totals"]["reasoning_tokens"] == 50
    # Priced as output tokens (genai-prices knows o4-mini): the output includes the reasoning.
    assert all(r["usage"]["cost_usd"] > 0 for r in runs)
