"""AnthropicProvider: the real anthropic SDK over HTTP against the fake upstream."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace

import pytest

from app.core.formats import to_anthropic
from app.core.messages import Message, ToolCall, ToolSpec
from app.core.tool_choice import NamedTool, ToolChoice
from app.llm.anthropic_provider import DEFAULT_MAX_TOKENS, AnthropicProvider
from app.llm.base import (
    Finish,
    ModelRequest,
    ProviderError,
    StreamEvent,
    TextDelta,
    ToolCallDelta,
    UsageReport,
)
from testkit.upstream import (
    Fail,
    FailMidStream,
    FakeUpstream,
    Malformed,
    Stall,
    Step,
    Text,
    Truncate,
    Usage,
)
from testkit.upstream import ToolCall as ScriptedCall
from tests.llm.streamed import collect, joined_text, tool_calls

WEATHER = ToolSpec(
    "get_weather",
    "The weather in a city.",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
CLOCK = ToolSpec("now", "The time.")
CONVERSATION = (
    Message("system", "You are terse."),
    Message("user", "Weather in Paris?"),
    Message(
        "assistant", "Looking.", tool_calls=(ToolCall("toolu_0", "get_weather", {"city": "Paris"}),)
    ),
    Message("tool", '{"temp": 21}', tool_call_id="toolu_0"),
    Message("user", "And in Rome?"),
)
HELLO = ModelRequest("claude-test", (Message("user", "Hi"),))


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream() as up:
        yield up


@pytest.fixture
async def provider(upstream: FakeUpstream) -> AsyncIterator[AnthropicProvider]:
    upstream.clear()
    provider = AnthropicProvider("sk-ant-test", upstream.url, timeout=5)
    yield provider
    await provider.aclose()


async def test_streams_text_then_one_usage_then_finish(
    provider: AnthropicProvider, upstream: FakeUpstream
) -> None:
    upstream.script(Text("Hel"), Text("lo"), Usage(12, 2, cached=4))

    events = await collect(provider.stream(HELLO))

    # Input counts the cache reads too (the wire says 8 uncached + 4 read), as OpenAI's does.
    assert events == [
        TextDelta("Hel"),
        TextDelta("lo"),
        UsageReport(input_tokens=12, output_tokens=2, cached_tokens=4),
        Finish("end_turn"),
    ]


async def test_sends_system_messages_and_tools_as_formatted(
    provider: AnthropicProvider, upstream: FakeUpstream
) -> None:
    request = ModelRequest(
        "claude-test", CONVERSATION, tools=(WEATHER, CLOCK), max_output_tokens=300
    )

    await collect(provider.stream(request))

    [received] = upstream.requests
    wire = to_anthropic(CONVERSATION, (WEATHER, CLOCK))
    assert received.path == "/v1/messages"
    assert received.body == {
        "model": "claude-test",
        "system": wire["system"],
        "messages": wire["messages"],
        "tools": wire["tools"],
        "max_tokens": 300,
        "stream": True,
    }
    assert received.body["system"] == [{"type": "text", "text": "You are terse."}]


async def test_max_tokens_defaults_and_unset_fields_stay_out(
    provider: AnthropicProvider, upstream: FakeUpstream
) -> None:
    await collect(provider.stream(replace(HELLO, temperature=0.5)))

    body = upstream.requests[0].body
    assert body["max_tokens"] == DEFAULT_MAX_TOKENS
    assert set(body) == {"model", "messages", "max_tokens", "stream"}


async def test_tool_use_blocks_reassemble(
    provider: AnthropicProvider, upstream: FakeUpstream
) -> None:
    upstream.script(
        Text("Checking."),
        ScriptedCall("toolu_1", "get_weather", '{"city": "Rome"}', fragments=4),
        ScriptedCall("toolu_2", "now", ""),
    )

    events = await collect(provider.stream(replace(HELLO, tools=(WEATHER, CLOCK))))

    assert joined_text(events) == "Checking."
    # A call without parameters streams no JSON; it reads as an empty object all the same.
    assert tool_calls(events) == [
        ("toolu_1", "get_weather", '{"city": "Rome"}'),
        ("toolu_2", "now", "{}"),
    ]
    indexes = {e.index for e in events if isinstance(e, ToolCallDelta)}
    assert indexes == {1, 2}  # content block indexes: the text was block 0
    assert json.loads(tool_calls(events)[0][2]) == {"city": "Rome"}
    assert isinstance(events[-2], UsageReport)
    assert events[-1] == Finish("tool_use")


@pytest.mark.parametrize(
    ("status", "kind", "expected"),
    [
        (429, None, "rate_limited"),
        (500, None, "server"),
        (503, "server", "server"),
        (529, None, "overloaded"),
        (400, None, "bad_request"),
        (413, "too_large", "bad_request"),
        (401, None, "auth"),
        (403, "permission", "auth"),
        (404, None, "not_found"),
    ],
)
async def test_errors_before_output_are_classified(
    provider: AnthropicProvider,
    upstream: FakeUpstream,
    status: int,
    kind: str | None,
    expected: str,
) -> None:
    upstream.script(Fail(status, kind, message="nope"))
    events: list[StreamEvent] = []

    with pytest.raises(ProviderError) as caught:
        await collect(provider.stream(HELLO), events)

    assert events == []
    assert caught.value.kind == expected
    assert caught.value.status == status
    assert caught.value.message == "nope"


@pytest.mark.parametrize(
    ("failure", "expected"),
    [
        (FailMidStream("overloaded", "Overloaded"), "overloaded"),
        (FailMidStream("server", "Internal error"), "server"),
        (FailMidStream("rate_limit", "Slow down"), "rate_limited"),
        (FailMidStream(disconnect=True), "connection"),
        (Truncate(), "server"),
        (Malformed(), "bad_response"),
    ],
)
async def test_failure_mid_stream_comes_after_the_deltas(
    provider: AnthropicProvider, upstream: FakeUpstream, failure: Step, expected: str
) -> None:
    upstream.script(Text("Hel"), Text("lo"), failure)
    events: list[StreamEvent] = []

    with pytest.raises(ProviderError) as caught:
        await collect(provider.stream(HELLO), events)

    assert events == [TextDelta("Hel"), TextDelta("lo")]
    assert caught.value.kind == expected
    assert caught.value.retryable


async def test_an_event_that_is_not_json_is_a_bad_response(
    provider: AnthropicProvider, upstream: FakeUpstream
) -> None:
    upstream.script(Malformed("{not json"))

    with pytest.raises(ProviderError) as caught:
        await collect(provider.stream(HELLO))

    assert caught.value.kind == "bad_response" and caught.value.retryable
    assert caught.value.as_error()["code"] == "provider_bad_response"
    assert "not JSON" in caught.value.message


async def test_an_overloaded_event_keeps_its_message(
    provider: AnthropicProvider, upstream: FakeUpstream
) -> None:
    upstream.script(Text("a"), FailMidStream("overloaded", "Overloaded right now"))

    with pytest.raises(ProviderError) as caught:
        await collect(provider.stream(HELLO))

    assert caught.value.message == "Overloaded right now"


async def test_a_stall_mid_stream_times_out(upstream: FakeUpstream) -> None:
    upstream.clear()
    upstream.script(Text("a"), Stall(3))
    provider = AnthropicProvider("sk-ant-test", upstream.url, timeout=0.3)
    events: list[StreamEvent] = []
    try:
        with pytest.raises(ProviderError) as caught:
            await collect(provider.stream(HELLO), events)
    finally:
        await provider.aclose()

    assert events == [TextDelta("a")]
    assert caught.value.kind == "timeout"


async def test_cache_breakpoints_go_out_as_cache_control_marks(
    provider: AnthropicProvider, upstream: FakeUpstream
) -> None:
    # The system message, the history before the newest turn, and the newest message.
    request = ModelRequest("claude-test", CONVERSATION, cache_breakpoints=(0, 3, 4))

    await collect(provider.stream(request))

    body = upstream.requests[0].body
    ephemeral = {"type": "ephemeral"}
    assert body["system"] == [
        {"type": "text", "text": "You are terse.", "cache_control": ephemeral}
    ]
    marked = [
        (turn["role"], block["type"])
        for turn in body["messages"]
        for block in turn["content"]
        if block.get("cache_control") == ephemeral
    ]
    assert marked == [("user", "tool_result"), ("user", "text")]
    assert body["messages"][-1]["content"][-1] == {
        "type": "text",
        "text": "And in Rome?",
        "cache_control": ephemeral,
    }


async def test_cache_reads_and_writes_are_reported_apart(
    provider: AnthropicProvider, upstream: FakeUpstream
) -> None:
    # The wire says 2 uncached, 4 read from the cache and 6 written to it.
    upstream.script(Text("ok"), Usage(12, 2, cached=4, written=6))

    events = await collect(provider.stream(HELLO))

    assert UsageReport(12, 2, cached_tokens=4, cache_write_tokens=6) in events


@pytest.mark.parametrize(
    ("choice", "parallel", "sent"),
    [
        ("none", True, {"type": "none"}),
        ("required", True, {"type": "any"}),
        ("required", False, {"type": "any", "disable_parallel_tool_use": True}),
        (NamedTool("now"), True, {"type": "tool", "name": "now"}),
        ("auto", False, {"type": "auto", "disable_parallel_tool_use": True}),
        ("auto", True, None),
    ],
)
async def test_tool_choice_goes_out_as_the_messages_api_field(
    provider: AnthropicProvider,
    upstream: FakeUpstream,
    choice: ToolChoice,
    parallel: bool,
    sent: dict[str, object] | None,
) -> None:
    request = replace(
        HELLO, tools=(WEATHER, CLOCK), tool_choice=choice, parallel_tool_calls=parallel
    )

    await collect(provider.stream(request))

    body = upstream.requests[0].body
    assert body.get("tool_choice") == sent
    assert [t["name"] for t in body["tools"]] == ["get_weather", "now"]


async def test_no_tool_choice_goes_out_without_tools(
    provider: AnthropicProvider, upstream: FakeUpstream
) -> None:
    await collect(provider.stream(replace(HELLO, tool_choice="none", parallel_tool_calls=False)))

    assert set(upstream.requests[0].body) == {"model", "messages", "max_tokens", "stream"}
