"""The OpenAI Responses provider against the fake upstream's /v1/responses, through the real
openai SDK: events in the model's order, the request it sends, its errors classified as the
Chat Completions provider's are (retryable or not)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import replace

import pytest

from app.core.messages import Message, ToolCall, ToolSpec
from app.core.output_schema import ResponseFormat
from app.core.reasoning import Reasoning
from app.core.usage import UsageReport
from app.llm.base import (
    Finish,
    ModelRequest,
    ProviderError,
    ReasoningBlock,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
)
from app.llm.openai_responses_provider import OpenAIResponsesProvider
from testkit.upstream import (
    Chunk,
    Fail,
    FailMidStream,
    FakeUpstream,
    JsonAnswer,
    Malformed,
    RedactedThinking,
    Step,
    Text,
    Thinking,
    Truncate,
    Usage,
    sealed_reasoning,
)
from testkit.upstream import (
    ToolCall as ScriptedCall,
)
from tests.llm.streamed import collect, joined_text, tool_calls

WEATHER = ToolSpec(
    "get_weather",
    "The weather in a city.",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
HELLO = ModelRequest("o4-mini", (Message("user", "Hi"),))


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream() as up:
        yield up


@pytest.fixture
async def provider(upstream: FakeUpstream) -> AsyncIterator[OpenAIResponsesProvider]:
    upstream.clear()
    provider = OpenAIResponsesProvider("sk-test", upstream.openai_base_url, timeout=5)
    yield provider
    await provider.aclose()


async def test_streams_reasoning_text_and_calls_in_order_then_usage_then_finish(
    provider: OpenAIResponsesProvider, upstream: FakeUpstream
) -> None:
    upstream.script(
        Thinking("Look it up.", fragments=2),
        RedactedThinking("hidden"),
        Text("Checking."),
        ScriptedCall("call_9", "get_weather", '{"city": "Paris"}'),
        Usage(30, 80, cached=10, reasoning=64),
    )

    events = await collect(provider.stream(HELLO))

    summary = {"type": "summary_text", "text": "Look it up."}
    assert events[:4] == [
        ReasoningDelta(0, "Look i"),
        ReasoningDelta(0, "t up."),
        ReasoningBlock(
            0,
            {
                "type": "reasoning",
                "id": "rs_fake0",
                "encrypted_content": sealed_reasoning("rs_fake0", "Look it up.", 0, 2),
                "summary": [summary],
            },
        ),
        ReasoningBlock(
            1,
            {
                "type": "reasoning",
                "id": "rs_fake1",
                "encrypted_content": sealed_reasoning("rs_fake1", "hidden", 1, 2),
                "summary": [],
            },
        ),
    ]
    assert events[4] == TextDelta("Checking.")
    assert isinstance(events[5], ToolCallDelta) and events[5].name == "get_weather"
    assert tool_calls(events) == [("call_9", "get_weather", '{"city": "Paris"}')]
    assert events[-2:] == [UsageReport(30, 80, 10, reasoning_tokens=64), Finish("tool_calls")]


async def test_sends_a_stateless_request_asking_for_encrypted_reasoning(
    provider: OpenAIResponsesProvider, upstream: FakeUpstream
) -> None:
    conversation = (
        Message("system", "You are terse."),
        Message("user", "Weather in Paris?"),
        Message("assistant", "", tool_calls=(ToolCall("call_0", "get_weather", {"city": "P"}),)),
        Message("tool", '{"temp": 21}', tool_call_id="call_0"),
        Message("user", "And in Rome?"),
    )
    request = ModelRequest(
        "o4-mini",
        conversation,
        tools=(WEATHER,),
        max_output_tokens=500,
        reasoning=Reasoning(budget_tokens=3000),
        tool_choice="required",
        parallel_tool_calls=False,
        cache_key="threadline-s",
    )

    await collect(provider.stream(request))

    body = upstream.requests[0].body
    assert upstream.requests[0].path == "/v1/responses"
    assert body["store"] is False and body["stream"] is True
    assert body["include"] == ["reasoning.encrypted_content"]
    assert body["reasoning"] == {"effort": "medium", "summary": "auto"}  # 3000 <= medium's
    assert body["max_output_tokens"] == 500 and body["prompt_cache_key"] == "threadline-s"
    assert body["tool_choice"] == "required" and body["parallel_tool_calls"] is False
    assert body["tools"] == [
        {
            "type": "function",
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": WEATHER.parameters,
            "strict": False,
        }
    ]
    assert body["input"] == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
        {
            "type": "function_call",
            "call_id": "call_0",
            "name": "get_weather",
            "arguments": '{"city":"P"}',
        },
        {"type": "function_call_output", "call_id": "call_0", "output": '{"temp": 21}'},
        {"role": "user", "content": [{"type": "input_text", "text": "And in Rome?"}]},
    ]


async def test_a_named_tool_choice_takes_the_responses_shape(
    provider: OpenAIResponsesProvider, upstream: FakeUpstream
) -> None:
    from app.core.tool_choice import NamedTool

    request = ModelRequest(
        "o4-mini", HELLO.messages, tools=(WEATHER,), tool_choice=NamedTool("get_weather")
    )

    await collect(provider.stream(request))

    assert upstream.requests[0].body["tool_choice"] == {"type": "function", "name": "get_weather"}


async def test_an_incomplete_response_finishes_as_length(
    provider: OpenAIResponsesProvider, upstream: FakeUpstream
) -> None:
    upstream.script(Text("Cut"), stop_reason="length")

    events = await collect(provider.stream(HELLO))

    assert events[-1] == Finish("length") and events[-1].neutral == "length"


@pytest.mark.parametrize(
    ("step", "kind", "retryable"),
    [
        (Fail(400, "bad_request"), "bad_request", False),
        (Fail(401, "auth"), "auth", False),
        (Fail(429, "rate_limit"), "rate_limited", True),
        (Fail(429, "quota"), "auth", False),
        (Fail(500, "server"), "server", True),
        (Fail(529, "overloaded"), "overloaded", True),
        (FailMidStream("server", "The server had an error"), "server", True),
        (FailMidStream("rate_limit", "Rate limit reached"), "rate_limited", True),
        (FailMidStream(disconnect=True), "connection", True),
        (Malformed(), "bad_response", True),
        (Truncate(), "server", True),
    ],
)
async def test_errors_are_classified_as_for_chat_completions(
    provider: OpenAIResponsesProvider,
    upstream: FakeUpstream,
    step: Step,
    kind: str,
    retryable: bool,
) -> None:
    # An HTTP error comes before any output; the others after some.
    upstream.script(*((step,) if isinstance(step, Fail) else (Text("Hal"), step)))

    with pytest.raises(ProviderError) as failure:
        await collect(provider.stream(HELLO))

    assert (failure.value.kind, failure.value.retryable) == (kind, retryable)


async def test_a_failed_response_is_an_error(
    provider: OpenAIResponsesProvider, upstream: FakeUpstream
) -> None:
    failed = {"id": "resp_x", "status": "failed", "output": []}
    error = {"code": "server_error", "message": "The model failed."}
    upstream.script(
        Text("Hal"), Chunk({"type": "response.failed", "response": {**failed, "error": error}})
    )

    with pytest.raises(ProviderError) as failure:
        await collect(provider.stream(HELLO))

    assert failure.value.kind == "server" and failure.value.retryable
    assert failure.value.message == "The model failed."


async def test_a_reasoning_item_without_its_encrypted_content_is_a_bad_response(
    provider: OpenAIResponsesProvider, upstream: FakeUpstream
) -> None:
    bare = {"id": "rs_1", "type": "reasoning", "summary": []}
    upstream.script(Chunk({"type": "response.output_item.done", "output_index": 0, "item": bare}))

    with pytest.raises(ProviderError) as failure:
        await collect(provider.stream(HELLO))

    assert failure.value.kind == "bad_response"


async def test_a_model_that_cannot_reason_is_not_asked_for_encrypted_reasoning(
    upstream: FakeUpstream,
) -> None:
    upstream.clear()
    provider = OpenAIResponsesProvider(
        "sk-test", upstream.openai_base_url, timeout=5, reasons=lambda model: model != "gpt-4o"
    )
    try:
        await collect(provider.stream(ModelRequest("gpt-4o", HELLO.messages)))
        await collect(provider.stream(HELLO))
    finally:
        await provider.aclose()

    plain, reasoning = (r.body for r in upstream.requests)
    assert "include" not in plain and plain["store"] is False
    assert reasoning["include"] == ["reasoning.encrypted_content"]


async def test_a_structured_output_format_goes_as_text_format(
    provider: OpenAIResponsesProvider, upstream: FakeUpstream
) -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    }
    structured = ResponseFormat.model_validate(
        {"type": "json_schema", "json_schema": {"name": "place", "schema": schema}}
    )
    upstream.script(JsonAnswer({"city": "Oslo"}))

    events = await collect(provider.stream(replace(HELLO, response_format=structured)))

    assert joined_text(events) == '{"city": "Oslo"}'
    assert upstream.requests[0].body["text"] == {
        "format": {"type": "json_schema", "name": "place", "schema": schema, "strict": True}
    }
