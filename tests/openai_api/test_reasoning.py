"""Reasoning through the Responses facade, driven by the official `openai` SDK: `reasoning` and
`include` accepted, reasoning items in the output and their summary events in the stream, in
OpenAI's shapes, from an Anthropic model thinking behind the fake upstream."""

from __future__ import annotations

from typing import Any

import openai
import pytest
from openai import AsyncOpenAI
from openai.types.responses import (
    ResponseOutputMessage,
    ResponseReasoningItem,
    ResponseReasoningSummaryPartAddedEvent,
    ResponseReasoningSummaryPartDoneEvent,
    ResponseReasoningSummaryTextDeltaEvent,
    ResponseReasoningSummaryTextDoneEvent,
    ResponseStreamEvent,
)

from testkit.upstream import (
    FakeUpstream,
    RedactedThinking,
    Text,
    Thinking,
    redacted_data,
    signature,
)

MODEL = "anthropic:claude-sonnet-4-5"
# Kept byte for byte: spaces at its ends, tabs, newlines, characters beyond ASCII.
THOUGHT = "  Oslo in winter:\tcold.\n\u2603\U0001f914 "


def ended(events: list[ResponseStreamEvent]) -> Any:
    last = events[-1]
    assert last.type == "response.completed", last
    return last.response


async def test_a_response_with_reasoning_returns_its_reasoning_items(
    client: AsyncOpenAI, upstream: FakeUpstream
) -> None:
    upstream.script(Thinking(THOUGHT), RedactedThinking("flagged"), Text("Wear a coat."))
    response = await client.responses.create(
        model=MODEL,
        input="Weather in Oslo?",
        reasoning={"effort": "low", "summary": "auto"},
    )

    assert response.status == "completed" and response.output_text == "Wear a coat."
    # Effort low is Threadline's low: a thinking budget of 1024 tokens, asked of the model.
    assert upstream.requests[-1].body["thinking"] == {"type": "enabled", "budget_tokens": 1024}
    assert response.reasoning is not None and response.reasoning.effort == "low"
    thought, redacted, message = response.output
    assert isinstance(thought, ResponseReasoningItem) and thought.id.startswith("rs_")
    assert [(s.type, s.text) for s in thought.summary] == [("summary_text", THOUGHT)]
    assert thought.encrypted_content is None  # not included
    assert isinstance(redacted, ResponseReasoningItem) and redacted.summary == []
    assert isinstance(message, ResponseOutputMessage)

    # Read back with include: the provider's opaque content, byte for byte.
    again = await client.responses.retrieve(response.id, include=["reasoning.encrypted_content"])
    assert [item.model_dump() for item in again.output[2:]] == [
        item.model_dump() for item in response.output[2:]
    ]
    first, second = again.output[0], again.output[1]
    assert isinstance(first, ResponseReasoningItem) and isinstance(second, ResponseReasoningItem)
    assert first.id == thought.id and first.encrypted_content == signature(THOUGHT, 0, 2)
    assert second.encrypted_content == redacted_data("flagged", 1, 2)


async def test_include_on_create_carries_the_encrypted_content(
    client: AsyncOpenAI, upstream: FakeUpstream
) -> None:
    upstream.script(Thinking("Short."), Text("Yes."))
    response = await client.responses.create(
        model=MODEL,
        input="Is it?",
        reasoning={"effort": "medium"},
        include=["reasoning.encrypted_content"],
    )
    thought = response.output[0]
    assert isinstance(thought, ResponseReasoningItem)
    assert thought.encrypted_content == signature("Short.", 0, 1)
    assert upstream.requests[-1].body["thinking"]["budget_tokens"] == 4096


async def test_a_streamed_response_streams_its_reasoning_summary_events(
    client: AsyncOpenAI, upstream: FakeUpstream
) -> None:
    upstream.script(Thinking(THOUGHT, fragments=3), RedactedThinking(), Text("Coat."))
    stream = await client.responses.create(
        model=MODEL,
        input="Weather in Oslo?",
        reasoning={"effort": "minimal", "summary": "detailed"},
        stream=True,
    )
    events = [event async for event in stream]
    response = ended(events)

    deltas = [e for e in events if isinstance(e, ResponseReasoningSummaryTextDeltaEvent)]
    assert "".join(e.delta for e in deltas) == THOUGHT
    thought = response.output[0]
    assert isinstance(thought, ResponseReasoningItem)
    assert {e.item_id for e in deltas} == {thought.id}
    assert all(e.output_index == 0 and e.summary_index == 0 for e in deltas)
    # One summary part, added before its deltas and done after them, with the whole text.
    types = [e.type for e in events]
    added = [e for e in events if isinstance(e, ResponseReasoningSummaryPartAddedEvent)]
    done = [e for e in events if isinstance(e, ResponseReasoningSummaryTextDoneEvent)]
    part_done = [e for e in events if isinstance(e, ResponseReasoningSummaryPartDoneEvent)]
    assert len(added) == len(done) == len(part_done) == 1
    assert done[0].text == THOUGHT and part_done[0].part.text == THOUGHT
    first_delta = types.index("response.reasoning_summary_text.delta")
    assert types.index("response.reasoning_summary_part.added") < first_delta
    assert types.index("response.reasoning_summary_text.done") > first_delta
    # Each reasoning item added and done once, before the message's text begins.
    item_events = [
        (e.type, e.item.type, e.output_index)
        for e in events
        if e.type in ("response.output_item.added", "response.output_item.done")
    ]
    assert item_events[:4] == [
        ("response.output_item.added", "reasoning", 0),
        ("response.output_item.done", "reasoning", 0),
        ("response.output_item.added", "reasoning", 1),
        ("response.output_item.done", "reasoning", 1),
    ]
    assert types.index("response.output_item.done") < types.index("response.output_text.delta")
    redacted = response.output[1]
    assert isinstance(redacted, ResponseReasoningItem) and redacted.summary == []
    # Minimal is Threadline's least effort, low.
    assert upstream.requests[-1].body["thinking"]["budget_tokens"] == 1024
    # The streamed response and the one read back are the same.
    again = await client.responses.retrieve(response.id)
    assert again.model_dump()["output"] == response.model_dump()["output"]


async def test_reasoning_off_for_one_response(client: AsyncOpenAI, upstream: FakeUpstream) -> None:
    upstream.script(Text("Hi."))
    response = await client.responses.create(
        model=MODEL, input="Hello", reasoning={"effort": "none"}
    )
    assert response.output_text == "Hi." and response.reasoning is None
    assert "thinking" not in upstream.requests[-1].body


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"reasoning": {"effort": "xhigh"}}, "reasoning.effort"),
        ({"reasoning": {"summary": "verbose"}}, "reasoning.summary"),
        (
            {"reasoning": {"effort": "low", "generate_summary": "auto"}},
            "reasoning.generate_summary",
        ),
        ({"include": ["message.output_text.logprobs"]}, "include[0]"),
    ],
)
async def test_reasoning_values_threadline_cannot_serve_are_openai_400s(
    client: AsyncOpenAI, upstream: FakeUpstream, extra: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        await client.responses.create(model=MODEL, input="Hi", extra_body=extra)
    body = refused.value.body
    assert isinstance(body, dict) and body["param"] == param, body
    assert upstream.requests == []


async def test_reasoning_for_a_model_that_cannot_reason_is_refused(
    client: AsyncOpenAI, upstream: FakeUpstream
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        await client.responses.create(model="gpt-4o-mini", input="Hi", reasoning={"effort": "high"})
    body = refused.value.body
    assert isinstance(body, dict) and body["code"] == "reasoning_not_supported"
    assert body["param"] == "reasoning"
    with pytest.raises(openai.BadRequestError) as include:
        await client.responses.retrieve("resp_" + "0" * 32, include=["file_search_call.results"])
    assert isinstance(include.value.body, dict) and include.value.body["param"] == "include[0]"
    assert upstream.requests == []


async def test_a_streamed_response_with_include_ends_with_the_encrypted_content(
    client: AsyncOpenAI, upstream: FakeUpstream
) -> None:
    """The run's events do not carry the provider's opaque content: the ended response does,
    read from the journal, and a replay of the stream alike."""
    upstream.script(Thinking("Quick."), RedactedThinking("flagged"), Text("Done."))
    stream = await client.responses.create(
        model=MODEL,
        input="Go",
        reasoning={"effort": "low"},
        include=["reasoning.encrypted_content"],
        stream=True,
    )
    events = [event async for event in stream]
    thought, redacted, _ = ended(events).output
    assert isinstance(thought, ResponseReasoningItem)
    assert isinstance(redacted, ResponseReasoningItem)
    assert thought.encrypted_content == signature("Quick.", 0, 2)
    assert redacted.encrypted_content == redacted_data("flagged", 1, 2)
    assert [s.text for s in thought.summary] == ["Quick."]

    replay = await client.responses.retrieve(
        ended(events).id, stream=True, include=["reasoning.encrypted_content"]
    )
    replayed = [event async for event in replay]
    assert ended(replayed).model_dump()["output"] == ended(events).model_dump()["output"]


async def test_a_conversations_items_show_its_reasoning_before_each_answer(
    client: AsyncOpenAI, upstream: FakeUpstream
) -> None:
    """Listed as conversation items, a reasoning answer is its reasoning items (the readable
    text as the summary; none of the provider's opaque content), then its message."""
    conversation = await client.conversations.create()
    upstream.script(Thinking(THOUGHT), RedactedThinking("flagged"), Text("Wear a coat."))
    await client.responses.create(
        model=MODEL,
        conversation=conversation.id,
        input="Weather in Oslo?",
        reasoning={"effort": "low", "summary": "auto"},
    )
    page = await client.conversations.items.list(conversation.id, order="asc")
    kinds = [item.type for item in page.data]
    assert kinds == ["message", "reasoning", "reasoning", "message"]
    thought, redacted = page.data[1], page.data[2]
    assert isinstance(thought, ResponseReasoningItem)
    assert isinstance(redacted, ResponseReasoningItem)
    assert [(s.type, s.text) for s in thought.summary] == [("summary_text", THOUGHT)]
    assert redacted.summary == [] and thought.id != redacted.id
    assert "flagged" not in page.model_dump_json() and "signature" not in page.model_dump_json()
