"""The Responses and Conversations API driven by the official `openai` SDK, unchanged, against
the served app with the fake upstream behind it (OpenAI and Anthropic models)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from openai import AsyncOpenAI
from openai.types.conversations import Message
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseCreatedEvent,
    ResponseFailedEvent,
    ResponseIncompleteEvent,
    ResponseOutputMessage,
    ResponseStreamEvent,
    ResponseTextDeltaEvent,
    ToolChoiceFunction,
)
from sqlalchemy.ext.asyncio import AsyncEngine

from app.eventlog import store as event_store
from testkit.api import history, new_session
from testkit.upstream import Fail, FailMidStream, FakeUpstream, Hold, Text, ToolCall, Usage

MODELS = ["gpt-4o-mini", "anthropic:claude-haiku-4-5"]
WEATHER: Any = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
REASONING: Any = {"type": "reasoning", "summary": []}
BUILTIN_CALCULATOR: Any = {"type": "builtin", "name": "calculator"}  # a Threadline extension
DEADLINE_SECONDS = 120  # a guard against a hang, never a speed check


def prompt_texts(upstream: FakeUpstream) -> list[tuple[str, str]]:
    """The last upstream request's conversation as (role, text), in either wire format."""
    body = upstream.requests[-1].body
    out = []
    if isinstance(body.get("system"), list | str):  # Anthropic
        system = body["system"]
        text = system if isinstance(system, str) else "".join(b["text"] for b in system)
        out.append(("system", text))
    for message in body["messages"]:
        content = message.get("content")
        if isinstance(content, list):
            content = "".join(b.get("text", "") for b in content if isinstance(b, dict))
        out.append((message["role"], content or ""))
    return out


def ended(events: list[ResponseStreamEvent]) -> Response:
    """The response of a stream's last event (completed, incomplete or failed)."""
    last = events[-1]
    assert isinstance(last, ResponseCompletedEvent | ResponseIncompleteEvent | ResponseFailedEvent)
    return last.response


def streamed_text(events: list[ResponseStreamEvent]) -> str:
    return "".join(e.delta for e in events if isinstance(e, ResponseTextDeltaEvent))


def session_of(conversation_id: str) -> str:
    hexed = conversation_id.removeprefix("conv_")
    return f"{hexed[:8]}-{hexed[8:12]}-{hexed[12:16]}-{hexed[16:20]}-{hexed[20:]}"


@pytest.fixture
def release() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()


async def until(check: Any, what: str) -> Any:
    deadline = time.monotonic() + DEADLINE_SECONDS
    while time.monotonic() < deadline:
        value = await check()
        if value:
            return value
        await asyncio.sleep(0.05)
    raise AssertionError(f"never: {what}")


@pytest.mark.parametrize("model", MODELS)
async def test_a_chain_of_responses_streams_and_keeps_the_conversation(
    client: AsyncOpenAI, upstream: FakeUpstream, model: str
) -> None:
    upstream.script(Text("Oslo is"), Text(" cold."), Usage(12, 3))
    first = await client.responses.create(
        model=model, input="Weather in Oslo?", instructions="Be brief."
    )
    assert first.status == "completed" and first.output_text == "Oslo is cold."
    assert first.usage is not None and first.usage.input_tokens == 12
    assert prompt_texts(upstream)[-1] == ("user", "Weather in Oslo?")
    assert ("system", "Be brief.") in prompt_texts(upstream)
    wire = "/messages" if model.startswith("anthropic:") else "/chat/completions"
    assert upstream.requests[-1].path.endswith(wire)

    upstream.script(Text("Pack"), Text(" a coat."), Usage(20, 3))
    stream = await client.responses.create(
        model=model, previous_response_id=first.id, input="And tomorrow?", stream=True
    )
    events = [event async for event in stream]
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert streamed_text(events) == "Pack a coat."
    done = ended(events)
    assert done.output_text == "Pack a coat." and done.previous_response_id == first.id
    # The same conversation: the model saw the whole history, sent once.
    assert done.conversation is not None and first.conversation is not None
    assert done.conversation.id == first.conversation.id
    assert prompt_texts(upstream)[-3:] == [
        ("user", "Weather in Oslo?"),
        ("assistant", "Oslo is cold."),
        ("user", "And tomorrow?"),
    ]
    # Read back: the same output, with the ids the stream gave.
    again = await client.responses.retrieve(done.id)
    assert [o.id for o in again.output] == [o.id for o in done.output]
    assert again.output_text == "Pack a coat." and again.status == "completed"
    items = await client.responses.input_items.list(done.id)
    assert [(i.type, i.role) for i in items.data] == [("message", "user")]  # type: ignore[union-attr]


async def test_a_conversation_with_items(
    client: AsyncOpenAI, upstream: FakeUpstream, api: httpx.AsyncClient
) -> None:
    conversation = await client.conversations.create(
        items=[
            {"type": "message", "role": "user", "content": "My name is Ada."},
            {"type": "message", "role": "assistant", "content": "Hello Ada."},
        ],
        metadata={"user": "42"},
    )
    assert conversation.id.startswith("conv_") and conversation.metadata == {"user": "42"}
    upstream.script(Text("You are Ada."))
    answer = await client.responses.create(
        model="gpt-4o-mini", conversation=conversation.id, input="Who am I?"
    )
    assert answer.output_text == "You are Ada."
    assert prompt_texts(upstream)[-3:] == [
        ("user", "My name is Ada."),
        ("assistant", "Hello Ada."),
        ("user", "Who am I?"),
    ]
    added = await client.conversations.items.create(
        conversation.id,
        items=[
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Note"}]}
        ],
    )
    assert [i.type for i in added.data] == ["message"]
    page = await client.conversations.items.list(conversation.id, order="asc")
    texts = [(m.role, m.content[0].text) for m in page.data if isinstance(m, Message)]  # type: ignore[union-attr]
    assert texts == [
        ("user", "My name is Ada."),
        ("assistant", "Hello Ada."),
        ("user", "Who am I?"),
        ("assistant", "You are Ada."),
        ("user", "Note"),
    ]
    # Pages: newest first by default, `after` goes on from an item.
    newest = await client.conversations.items.list(conversation.id, limit=2)
    assert [i.id for i in newest.data] == [page.data[4].id, page.data[3].id]
    assert newest.has_more
    rest = await client.conversations.items.list(
        conversation.id, limit=10, after=newest.last_id or ""
    )
    assert [i.id for i in rest.data] == [p.id for p in reversed(page.data[:3])]
    # It is a Threadline session, entries and all.
    journal = await history(api, session_of(conversation.id))
    assert [e["kind"] for e in journal if e["kind"] == "message"] == ["message"] * 5
    fetched = await client.conversations.retrieve(conversation.id)
    assert fetched.id == conversation.id
    updated = await client.conversations.update(conversation.id, metadata={"topic": "names"})
    assert updated.metadata == {"topic": "names"}
    assert (await client.conversations.retrieve(conversation.id)).metadata == {"topic": "names"}
    second = str(page.data[1].id)
    one = await client.conversations.items.retrieve(second, conversation_id=conversation.id)
    assert one.id == second
    with pytest.raises(openai.BadRequestError):
        await client.conversations.items.delete(second, conversation_id=conversation.id)
    with pytest.raises(openai.NotFoundError):
        await client.conversations.items.retrieve(second + "0", conversation_id=conversation.id)
    deleted = await client.conversations.delete(conversation.id)
    assert deleted.deleted
    with pytest.raises(openai.NotFoundError):
        await client.conversations.retrieve(conversation.id)


@pytest.mark.parametrize("model", MODELS)
async def test_a_function_tool_round_trip(
    client: AsyncOpenAI, upstream: FakeUpstream, model: str
) -> None:
    upstream.script(Text("Checking."), ToolCall("up_1", "get_weather", '{"city": "Oslo"}'))
    first = await client.responses.create(
        model=model,
        input="Weather in Oslo?",
        tools=[WEATHER],
    )
    assert first.status == "completed"
    calls = [o for o in first.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    assert json.loads(calls[0].arguments) == {"city": "Oslo"}
    assert first.output_text == "Checking."

    upstream.script(Text("It is 3 °C."), Usage(40, 5))
    stream = await client.responses.create(
        model=model,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "3 C"}],
        tools=[WEATHER],
        stream=True,
    )
    events = [e async for e in stream]
    assert events[-1].type == "response.completed"
    final = ended(events)
    assert final.output_text == "It is 3 °C."
    # The client's loop sees no function call it already answered.
    assert [o.type for o in final.output] == ["message"]
    sent = json.dumps(upstream.requests[-1].body)
    assert "3 C" in sent
    stored = await client.responses.retrieve(final.id)
    assert stored.previous_response_id == first.id == final.previous_response_id
    inputs = await client.responses.input_items.list(final.id)
    assert [i.type for i in inputs.data] == ["function_call_output"]
    # The first response still reads as it ended: with its function call.
    assert [o.type for o in (await client.responses.retrieve(first.id)).output] == [
        "message",
        "function_call",
    ]

    upstream.script(Text("Bye."))
    after = await client.responses.create(
        model=model, previous_response_id=final.id, input="Thanks"
    )
    assert after.output_text == "Bye."
    assert after.conversation is not None and first.conversation is not None
    assert after.conversation.id == first.conversation.id


@pytest.mark.parametrize("model", MODELS)
async def test_tool_choice_forces_a_function_on_the_first_turn(
    client: AsyncOpenAI, upstream: FakeUpstream, model: str
) -> None:
    named: Any = {"type": "function", "name": "get_weather"}
    upstream.script(ToolCall("up_1", "get_weather", '{"city": "Oslo"}'))
    first = await client.responses.create(
        model=model,
        input="Anything new?",
        tools=[WEATHER, BUILTIN_CALCULATOR],
        tool_choice=named,
        parallel_tool_calls=False,
    )
    assert [o.type for o in first.output] == ["function_call"]
    assert isinstance(first.tool_choice, ToolChoiceFunction)
    assert first.tool_choice.name == "get_weather" and first.parallel_tool_calls is False
    anthropic = model.startswith("anthropic:")
    assert upstream.requests[-1].body["tool_choice"] == (
        {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True}
        if anthropic
        else {"type": "function", "function": {"name": "get_weather"}}
    )
    call = first.output[0]
    assert call.type == "function_call"
    output: Any = [{"type": "function_call_output", "call_id": call.call_id, "output": "3 C"}]
    # The outputs continue the same response's run: with its tool_choice, not another.
    with pytest.raises(openai.BadRequestError) as other:
        await client.responses.create(
            model=model, previous_response_id=first.id, input=output, tool_choice="none"
        )
    assert isinstance(other.value.body, dict) and other.value.body["param"] == "tool_choice"

    upstream.script(Text("It is 3 °C."))
    final = await client.responses.create(
        model=model,
        previous_response_id=first.id,
        input=output,
        tools=[WEATHER, BUILTIN_CALCULATOR],
        tool_choice=named,
        parallel_tool_calls=False,
    )
    assert final.output_text == "It is 3 °C."
    # The turn after the forced one is the model's to decide (else it would never answer).
    after = upstream.requests[-1].body
    if anthropic:
        assert after["tool_choice"] == {"type": "auto", "disable_parallel_tool_use": True}
    else:
        assert "tool_choice" not in after and after["parallel_tool_calls"] is False
    stored = await client.responses.retrieve(first.id)
    assert isinstance(stored.tool_choice, ToolChoiceFunction)
    assert stored.tool_choice.model_dump() == named and stored.parallel_tool_calls is False


async def test_tool_choice_none_answers_without_calling(
    client: AsyncOpenAI, upstream: FakeUpstream
) -> None:
    upstream.script(Text("No tools today."))
    answer = await client.responses.create(
        model="gpt-4o-mini", input="Weather in Oslo?", tools=[WEATHER], tool_choice="none"
    )
    assert answer.tool_choice == "none" and answer.parallel_tool_calls is True
    assert [o.type for o in answer.output] == ["message"]
    assert upstream.requests[-1].body["tool_choice"] == "none"


async def test_a_built_in_tool_runs_in_the_service(
    client: AsyncOpenAI, upstream: FakeUpstream
) -> None:
    upstream.script(ToolCall("up_1", "calculator", '{"expression": "6 * 7"}'))
    upstream.script(Text("42."))
    answer = await client.responses.create(
        model="gpt-4o-mini",
        input="6 times 7?",
        tools=[BUILTIN_CALCULATOR],
    )
    assert answer.output_text == "42." and [o.type for o in answer.output] == ["message"]
    assert upstream.requests[-1].body["messages"][-1]["content"] == "42"


async def test_background_poll_and_cancel(
    client: AsyncOpenAI, upstream: FakeUpstream, release: threading.Event
) -> None:
    upstream.script(Text("Thinking"), Hold(release), Text(" never sent"))
    queued = await client.responses.create(model="gpt-4o-mini", input="Hard one", background=True)
    assert queued.status in ("queued", "in_progress") and queued.background

    async def running() -> bool:
        polled = await client.responses.retrieve(queued.id)
        return polled.status == "in_progress" and polled.output_text == "Thinking"

    await until(running, "the response is in progress with its first words")
    cancelled = await client.responses.cancel(queued.id)
    release.set()
    assert cancelled.status == "cancelled"
    polled = await client.responses.retrieve(queued.id)
    assert polled.status == "cancelled" and polled.output_text == "Thinking"
    assert isinstance(polled.output[0], ResponseOutputMessage)
    assert polled.output[0].status == "incomplete"


async def test_a_background_stream_resumes_after_a_sequence_number(
    client: AsyncOpenAI, upstream: FakeUpstream, release: threading.Event, e2e_engine: AsyncEngine
) -> None:
    upstream.script(Text("One"), Hold(release), Text(" two"), Text(" three"), Usage(8, 3))
    stream = await client.responses.create(
        model="gpt-4o-mini", input="Count", background=True, stream=True
    )
    seen = []
    async for event in stream:
        seen.append(event)
        if event.type == "response.output_text.delta":
            break  # the client drops the connection
    await stream.close()
    release.set()
    assert isinstance(seen[0], ResponseCreatedEvent)
    response_id = seen[0].response.id
    rest = await client.responses.retrieve(
        response_id, stream=True, starting_after=seen[-1].sequence_number
    )
    resumed = [e async for e in rest]
    assert [e.sequence_number for e in seen + resumed] == list(range(len(seen) + len(resumed)))
    text = "".join(e.delta for e in seen + resumed if e.type == "response.output_text.delta")
    assert text == "One two three"
    assert resumed[-1].type == "response.completed"
    # A replay from the start is the same events.
    replay = [e async for e in await client.responses.retrieve(response_id, stream=True)]
    assert [e.model_dump() for e in replay] == [e.model_dump() for e in seen + resumed]
    # Once the run's events are pruned (past their retention), the journal tells its end.
    async with e2e_engine.begin() as conn:
        assert (await event_store.prune(conn, 0)).events > 0
    late = [e async for e in await client.responses.retrieve(response_id, stream=True)]
    assert [e.type for e in late] == ["response.created", "response.completed"]
    assert ended(late).output_text == "One two three"
    assert ended(late).output[0].id == ended(replay).output[0].id


async def test_a_branch_from_an_older_response_forks_the_conversation(
    client: AsyncOpenAI, upstream: FakeUpstream, api: httpx.AsyncClient
) -> None:
    upstream.script(Text("A1"))
    first = await client.responses.create(model="gpt-4o-mini", input="Q1")
    upstream.script(Text("A2"))
    second = await client.responses.create(
        model="gpt-4o-mini", previous_response_id=first.id, input="Q2"
    )
    upstream.script(Text("B2"))
    branch = await client.responses.create(
        model="gpt-4o-mini", previous_response_id=first.id, input="Other Q2"
    )
    assert branch.output_text == "B2"
    assert prompt_texts(upstream)[-3:] == [
        ("user", "Q1"),
        ("assistant", "A1"),
        ("user", "Other Q2"),
    ]
    assert branch.conversation is not None and first.conversation is not None
    assert branch.conversation.id != first.conversation.id
    fork = (await api.get(f"/v1/sessions/{session_of(branch.conversation.id)}")).json()
    assert fork["parent_id"] == session_of(first.conversation.id)
    # The fork shares the prefix in place: nothing was copied.
    own = await history(api, fork["id"], after_seq=fork["fork_seq"])
    assert "Q1" not in [e["payload"].get("content") for e in own]
    # A branch whose question is refused leaves no fork behind.
    sessions = (await api.get("/v1/sessions")).json()["data"]
    bad_image: Any = [
        {"role": "user", "content": [{"type": "input_image", "image_url": "ftp://example.com/x"}]}
    ]
    with pytest.raises(openai.BadRequestError):
        await client.responses.create(
            model="gpt-4o-mini", previous_response_id=first.id, input=bad_image
        )
    assert (await api.get("/v1/sessions")).json()["data"] == sessions
    # Both branches go on.
    upstream.script(Text("A3"))
    third = await client.responses.create(
        model="gpt-4o-mini", previous_response_id=second.id, input="Q3"
    )
    assert third.conversation is not None and third.conversation.id == first.conversation.id


async def test_truncation_is_an_incomplete_response(
    client: AsyncOpenAI, upstream: FakeUpstream
) -> None:
    upstream.script(Text("A long ans"), stop_reason="length")
    cut = await client.responses.create(model="gpt-4o-mini", input="Tell me", max_output_tokens=16)
    assert cut.status == "incomplete"
    assert cut.incomplete_details is not None
    assert cut.incomplete_details.reason == "max_output_tokens"
    assert upstream.requests[-1].body["max_completion_tokens"] == 16 or (
        upstream.requests[-1].body.get("max_tokens") == 16
    )
    upstream.script(Text("A long ans"), stop_reason="length")
    stream = await client.responses.create(
        model="gpt-4o-mini", input="Tell me", max_output_tokens=16, stream=True
    )
    events = [e async for e in stream]
    assert events[-1].type == "response.incomplete"
    assert ended(events).incomplete_details is not None


async def test_metadata_and_temperature_reach_the_run(
    client: AsyncOpenAI, upstream: FakeUpstream
) -> None:
    upstream.script(Text("ok"))
    answer = await client.responses.create(
        model="gpt-4o-mini", input="Hi", temperature=0.3, metadata={"ticket": "7"}
    )
    assert answer.metadata == {"ticket": "7"} and answer.temperature == 0.3
    assert upstream.requests[-1].body["temperature"] == 0.3


async def test_deleting_a_response_takes_it_out_of_the_context(
    client: AsyncOpenAI, upstream: FakeUpstream
) -> None:
    upstream.script(Text("A1"))
    first = await client.responses.create(model="gpt-4o-mini", input="Q1")
    upstream.script(Text("A2"))
    second = await client.responses.create(
        model="gpt-4o-mini", previous_response_id=first.id, input="Q2"
    )
    await client.responses.delete(second.id)
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(second.id)
    assert first.conversation is not None
    upstream.script(Text("A3"))
    await client.responses.create(
        model="gpt-4o-mini", conversation=first.conversation.id, input="Q3"
    )
    assert [t for r, t in prompt_texts(upstream) if r != "system"] == ["Q1", "A1", "Q3"]
    # The conversation's items are what its context holds.
    items = await client.conversations.items.list(first.conversation.id, order="asc")
    texts = [m.content[0].text for m in items.data if isinstance(m, Message)]  # type: ignore[union-attr]
    assert texts == ["Q1", "A1", "Q3", "A3"]


async def test_refusals_are_openai_errors(
    client: AsyncOpenAI, upstream: FakeUpstream, service: Any
) -> None:
    with pytest.raises(openai.BadRequestError) as unsupported:
        await client.responses.create(model="gpt-4o-mini", input="Hi", top_p=0.5)
    assert unsupported.value.status_code == 400
    body = unsupported.value.body
    assert isinstance(body, dict) and body["param"] == "top_p"
    assert body["code"] == "unsupported_parameter" and "top_p" in body["message"]
    with pytest.raises(openai.BadRequestError) as store:
        await client.responses.create(model="gpt-4o-mini", input="Hi", store=False)
    assert isinstance(store.value.body, dict) and store.value.body["param"] == "store"
    with pytest.raises(openai.BadRequestError) as choice:
        await client.responses.create(model="gpt-4o-mini", input="Hi", tool_choice="required")
    assert isinstance(choice.value.body, dict) and choice.value.body["param"] == "tool_choice"
    with pytest.raises(openai.BadRequestError) as unknown:
        await client.responses.create(
            model="gpt-4o-mini",
            input="Hi",
            tools=[WEATHER],
            tool_choice={"type": "function", "name": "get_time"},
        )
    assert isinstance(unknown.value.body, dict) and unknown.value.body["param"] == "tool_choice"
    assert unknown.value.body["code"] == "invalid_tool_choice"
    assert "'get_time'" in unknown.value.body["message"]
    with pytest.raises(openai.BadRequestError) as hosted:
        await client.responses.create(
            model="gpt-4o-mini", input="Hi", tools=[WEATHER], tool_choice={"type": "file_search"}
        )
    assert isinstance(hosted.value.body, dict) and hosted.value.body["param"] == "tool_choice"
    assert hosted.value.body["code"] == "invalid_value"
    with pytest.raises(openai.BadRequestError) as model:
        await client.responses.create(model="compat:nowhere", input="Hi")
    assert isinstance(model.value.body, dict) and model.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as item:
        await client.responses.create(
            model="gpt-4o-mini",
            input=[REASONING],
        )
    assert isinstance(item.value.body, dict) and item.value.body["param"] == "input[0].type"
    with pytest.raises(openai.NotFoundError):
        await client.responses.create(
            model="gpt-4o-mini", input="Hi", previous_response_id="resp_" + "0" * 32
        )
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve("not-an-id")
    with pytest.raises(openai.BadRequestError) as outputs:
        await client.responses.create(
            model="gpt-4o-mini",
            input=[{"type": "function_call_output", "call_id": "c1", "output": "x"}],
        )
    assert isinstance(outputs.value.body, dict)
    assert outputs.value.body["param"] == "previous_response_id"
    async with AsyncOpenAI(
        base_url=str(client.base_url), api_key="not-a-key", max_retries=0
    ) as stranger:
        with pytest.raises(openai.AuthenticationError):
            await stranger.responses.create(model="gpt-4o-mini", input="Hi")
    assert upstream.requests == []  # nothing refused reached a model


async def test_history_sent_as_input_items_is_journaled_with_the_question(
    client: AsyncOpenAI, upstream: FakeUpstream, api: httpx.AsyncClient
) -> None:
    upstream.script(Text("Blue."))
    answer = await client.responses.create(
        model="gpt-4o-mini",
        input=[
            {"role": "developer", "content": "Answer in one word."},
            {"role": "user", "content": "Sky colour?"},
            {"role": "assistant", "content": "Which sky?"},
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "This one"},
                    {
                        "type": "input_image",
                        "image_url": "https://example.com/sky.png",
                        "detail": "low",
                    },
                ],
            },
        ],
    )
    assert answer.output_text == "Blue."
    items = await client.responses.input_items.list(answer.id, order="asc")
    assert [getattr(i, "role", None) for i in items.data] == ["system", "user", "assistant", "user"]
    sent = upstream.requests[-1].body["messages"]
    assert sent[-1]["content"][1]["image_url"]["url"] == "https://example.com/sky.png"
    assert answer.conversation is not None
    journal = await history(api, session_of(answer.conversation.id))
    assert [e["kind"] for e in journal][:5] == ["message"] * 4 + ["run_start"]


async def test_a_long_conversation_compacts_while_the_client_notices_nothing(
    client: AsyncOpenAI, upstream: FakeUpstream, api: httpx.AsyncClient
) -> None:
    from testkit import long_session

    session = await new_session(
        api,
        config={
            "system_prompt": "You are a careful assistant.",
            # A small window: the conversation outgrows it several times.
            "context_policy": {
                **long_session.POLICY,
                "max_input_tokens": 1500,
                "reserve_output_tokens": 300,
            },
        },
    )
    upstream.respond_with(long_session.respond)
    previous: str | None = None
    full_history = 0
    turns = 40
    for turn in range(1, turns + 1):
        text = long_session.user_text(turn)
        if "please run" in text:
            text = f"turn {turn}: tell me more."  # the session declares no tools here
        full_history += len(text)
        if previous is None:
            answer = await client.responses.create(
                model="gpt-4o-mini",
                conversation=f"conv_{session['id'].replace('-', '')}",
                input=text,
            )
        else:
            answer = await client.responses.create(
                model="gpt-4o-mini", previous_response_id=previous, input=text
            )
        assert answer.status == "completed", answer
        assert answer.output_text == f"Noted turn {turn}."
        previous = answer.id
        assert answer.conversation is not None
        assert answer.conversation.id == f"conv_{session['id'].replace('-', '')}"
    journal = await history(api, session["id"])
    assert any(e["kind"] == "summary" for e in journal)
    asks = [r for r in upstream.requests if not long_session.is_summarization(r.body)]
    last = json.dumps(asks[-1].body["messages"])
    assert len(last) < full_history  # a summary and the last turns, not the whole history
    assert "turn 1:" not in last and f"turn {turns}:" in last


async def test_a_failed_model_call_is_a_failed_response(
    client: AsyncOpenAI, upstream: FakeUpstream
) -> None:
    upstream.script(Fail(400, "bad_request", "no such thing"))
    failed = await client.responses.create(model="gpt-4o-mini", input="Hi")
    assert failed.status == "failed"
    assert failed.error is not None and failed.error.code == "server_error"
    assert failed.error.message.startswith("provider_bad_request: ")
    upstream.script(Fail(400, "bad_request", "no such thing"))
    stream = await client.responses.create(
        model="gpt-4o-mini", previous_response_id=failed.id, input="Again", stream=True
    )
    events = [e async for e in stream]
    assert events[-1].type == "response.failed" and ended(events).status == "failed"


async def test_leaving_a_stream_cancels_a_response_not_in_the_background(
    client: AsyncOpenAI, upstream: FakeUpstream, release: threading.Event
) -> None:
    upstream.script(Text("Start"), Hold(release), Text(" never"))
    stream = await client.responses.create(model="gpt-4o-mini", input="Go", stream=True)
    created = None
    async for event in stream:
        if isinstance(event, ResponseCreatedEvent):
            created = event.response
        if event.type == "response.output_text.delta":
            break
    await stream.close()
    assert created is not None and not created.background

    async def cancelled() -> bool:
        assert created is not None
        return (await client.responses.retrieve(created.id)).status == "cancelled"

    await until(cancelled, "the response is cancelled once its client left")
    release.set()
    kept = await client.responses.retrieve(created.id)
    assert kept.output_text == "Start"


async def test_the_sdk_stream_helper_builds_the_same_response(
    client: AsyncOpenAI, upstream: FakeUpstream
) -> None:
    """`client.responses.stream()` assembles the response from the events on its own."""
    upstream.script(Text("Hel"), Text("lo"), ToolCall("up_1", "get_weather", '{"city": "Oslo"}'))
    async with client.responses.stream(model="gpt-4o-mini", input="Hi", tools=[WEATHER]) as stream:
        async for _ in stream:
            pass
        final = await stream.get_final_response()
    assert final.output_text == "Hello"
    stored = await client.responses.retrieve(final.id)
    assert all(getattr(o, "id", None) for o in stored.output)
    assert [(o.type, getattr(o, "id", None)) for o in final.output] == [
        (o.type, getattr(o, "id", None)) for o in stored.output
    ]


async def test_instructions_are_the_conversation_s_prompt_unless_the_response_is_refused(
    client: AsyncOpenAI, upstream: FakeUpstream, api: httpx.AsyncClient
) -> None:
    upstream.script(Text("ok"))
    first = await client.responses.create(model="gpt-4o-mini", instructions="A", input="Hi")
    assert first.conversation is not None
    session = session_of(first.conversation.id)
    bad_image: Any = [
        {"role": "user", "content": [{"type": "input_image", "image_url": "ftp://example.com/x"}]}
    ]
    with pytest.raises(openai.BadRequestError):
        await client.responses.create(
            model="gpt-4o-mini", previous_response_id=first.id, instructions="B", input=bad_image
        )
    assert (await api.get(f"/v1/sessions/{session}")).json()["config"]["system_prompt"] == "A"
    upstream.script(Text("ok"))
    await client.responses.create(
        model="gpt-4o-mini", previous_response_id=first.id, instructions="B", input="Again"
    )
    assert (await api.get(f"/v1/sessions/{session}")).json()["config"]["system_prompt"] == "B"
    assert ("system", "B") in prompt_texts(upstream)


async def test_a_response_refused_once_its_conversation_is_made_leaves_nothing_behind(
    client: AsyncOpenAI, upstream: FakeUpstream, api: httpx.AsyncClient
) -> None:
    """Refused by what only the made conversation can tell (a tool_choice naming a function
    none of its tools is): the new conversation, the fork and the instructions were written
    in the ask's transaction, and are gone with it."""
    upstream.script(Text("A1"))
    first = await client.responses.create(model="gpt-4o-mini", instructions="A", input="Q1")
    upstream.script(Text("A2"))
    await client.responses.create(model="gpt-4o-mini", previous_response_id=first.id, input="Q2")
    assert first.conversation is not None
    session = session_of(first.conversation.id)
    sessions = (await api.get("/v1/sessions")).json()["data"]
    entries = await history(api, session)
    unserved: Any = {"type": "function", "name": "nowhere"}
    for previous in (None, first.id):  # a new conversation, a fork
        with pytest.raises(openai.BadRequestError):
            await client.responses.create(
                model="gpt-4o-mini",
                previous_response_id=previous,
                instructions="B",
                input="Hi",
                tool_choice=unserved,
            )
    assert (await api.get("/v1/sessions")).json()["data"] == sessions
    assert await history(api, session) == entries
    assert (await api.get(f"/v1/sessions/{session}")).json()["config"]["system_prompt"] == "A"


async def test_a_model_turn_that_started_over_is_not_in_the_output(
    client: AsyncOpenAI, upstream: FakeUpstream
) -> None:
    upstream.script(Text("voided"), FailMidStream())
    upstream.script(Text("kept"))
    answer = await client.responses.create(model="gpt-4o-mini", input="Hi")
    assert answer.output_text == "kept" and len(answer.output) == 1
    assert answer.conversation is not None
    items = await client.conversations.items.list(answer.conversation.id, order="asc")
    texts = [m.content[0].text for m in items.data if isinstance(m, Message)]  # type: ignore[union-attr]
    assert texts == ["Hi", "kept"]
    replay = [e async for e in await client.responses.retrieve(answer.id, stream=True)]
    assert ended(replay).output_text == "kept"
    assert [o.id for o in ended(replay).output] == [o.id for o in answer.output]
