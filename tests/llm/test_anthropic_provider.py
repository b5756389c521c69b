"""AnthropicProvider: the real anthropic SDK over HTTP against the fake upstream."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Collection, Iterator
from dataclasses import asdict, replace
from typing import Any, cast

import anthropic
import pydantic
import pytest
from anthropic.types import RawMessageStreamEvent
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.core.formats import to_anthropic
from app.core.messages import Message, ToolCall, ToolSpec
from app.core.output_schema import ResponseFormat
from app.core.reasoning import DEFAULT_ANSWER_TOKENS
from app.core.tool_choice import NamedTool, ToolChoice, anthropic_tool_choice
from app.core.usage import UsageReport
from app.llm.anthropic_provider import AnthropicProvider, _State
from app.llm.base import (
    Finish,
    ModelRequest,
    ProviderError,
    ReasoningBlock,
    ReasoningDelta,
    StreamEvent,
    TextDelta,
    ToolCallDelta,
)
from testkit.upstream import (
    Chunk,
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
STRUCTURED = ResponseFormat.model_validate(
    {
        "type": "json_schema",
        "json_schema": {
            "name": "city",
            "schema": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "pattern": "^[A-Z]"},
                    "people": {"type": "integer", "minimum": 0},
                },
                "required": ["name", "people"],
                "additionalProperties": False,
            },
        },
    }
)


def sdk_format(format: ResponseFormat) -> Any:
    """output_config.format as the SDK's own helper makes it of a JSON Schema."""
    return {"type": "json_schema", "schema": anthropic.transform_schema(format.schema_)}


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
    assert body["max_tokens"] == DEFAULT_ANSWER_TOKENS
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


# --- The body, and events read as parsed JSON -------------------------------------------------


@pytest.mark.parametrize(
    "request_",
    [
        HELLO,
        ModelRequest("claude-test", CONVERSATION, (WEATHER, CLOCK), 64, cache_breakpoints=(1,)),
        replace(HELLO, tools=(WEATHER,), tool_choice=NamedTool("get_weather")),
        replace(HELLO, tools=(WEATHER,), tool_choice="none", parallel_tool_calls=False),
        replace(HELLO, tools=(WEATHER,), response_format=STRUCTURED),
    ],
)
async def test_the_body_is_the_one_the_sdks_create_sends(
    provider: AnthropicProvider, upstream: FakeUpstream, request_: ModelRequest
) -> None:
    client = anthropic.AsyncAnthropic(
        api_key="sk-ant-test", base_url=upstream.url, max_retries=0, timeout=5
    )
    try:
        await collect(provider.stream(request_))
        # What the provider sent before it posted by itself: the same fields through create().
        wire = to_anthropic(request_.messages, request_.tools, request_.cache_breakpoints)
        choice = anthropic_tool_choice(
            request_.tool_choice, request_.parallel_tool_calls, "tools" in wire
        )
        omit = anthropic.omit
        events = await client.messages.create(
            model=request_.model,
            max_tokens=request_.max_output_tokens or DEFAULT_ANSWER_TOKENS,
            messages=wire["messages"],
            system=wire.get("system", omit),
            tools=wire.get("tools", omit),
            tool_choice=cast(Any, choice) if choice is not None else omit,
            output_config={"format": sdk_format(request_.response_format)}
            if request_.response_format is not None
            else omit,
            stream=True,
        )
        async with events:
            async for _ in events:
                pass
    finally:
        await client.close()

    ours, sdks = upstream.requests
    assert ours.path == sdks.path
    assert ours.headers == sdks.headers  # auth, version, lengths: all the same
    assert ours.headers["authorization"] == "Bearer sk-ant-test"
    assert ours.body == sdks.body
    assert list(ours.body) == list(sdks.body)  # in the same order too


def _delta(delta: dict[str, Any], index: int = 0) -> Chunk:
    return Chunk({"type": "content_block_delta", "index": index, "delta": delta})


async def test_events_the_api_may_send_are_read_as_before(
    provider: AnthropicProvider, upstream: FakeUpstream
) -> None:
    block = {"type": "thinking", "thinking": "", "signature": ""}
    upstream.script(
        Chunk({"type": "content_block_start", "index": 0, "content_block": block}),
        _delta({"type": "thinking_delta", "thinking": "Hmm."}),
        _delta({"type": "signature_delta", "signature": "c2ln"}),
        Chunk({"type": "content_block_stop", "index": 0}),
        Chunk({"type": "a_future_event", "whatever": [1]}),
        _delta({"type": "text_delta", "text": ""}, 1),
        _delta({"type": "text_delta", "text": "Hi"}, 1),
        ScriptedCall("toolu_1", "now", "", fragments=1),  # no input: "{}" at its end
    )

    events = await collect(provider.stream(replace(HELLO, tools=(CLOCK,))))

    thought = {"type": "thinking", "thinking": "Hmm.", "signature": "c2ln"}
    assert events[:5] == [
        ReasoningDelta(0, "Hmm."),
        ReasoningBlock(0, thought),
        TextDelta("Hi"),
        ToolCallDelta(0, "toolu_1", "now", ""),
        ToolCallDelta(0, None, None, "{}"),
    ]
    assert events[-1] == Finish("tool_use")


@pytest.mark.parametrize(
    "event",
    [
        None,
        ["content_block_delta"],
        {"type": 3},
        {"type": "content_block_delta", "index": 0, "delta": None},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta"}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": 1}},
        {"type": "content_block_delta", "delta": {"type": "input_json_delta", "partial_json": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": 7}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use"}},
        {"type": "content_block_start", "index": "0", "content_block": {"type": "text"}},
        {"type": "content_block_stop"},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}},
        {"type": "message_delta", "delta": {"stop_reason": 0}, "usage": {}},
        {"type": "message_delta", "delta": {}, "usage": {"output_tokens": "3"}},
        {"type": "message_start", "message": {"usage": None}},
    ],
)
async def test_an_event_of_the_wrong_shape_is_a_bad_response(
    provider: AnthropicProvider, upstream: FakeUpstream, event: object
) -> None:
    upstream.script(Text("Hel"), Chunk(event), Text("lo"))
    events: list[StreamEvent] = []

    with pytest.raises(ProviderError) as caught:
        await collect(provider.stream(HELLO), events)

    assert events == [TextDelta("Hel")]
    assert caught.value.kind == "bad_response" and caught.value.retryable


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=6,
)
Strategy = st.SearchStrategy[Any]
MESSAGE: dict[str, Any] = {
    "id": "msg",
    "type": "message",
    "role": "assistant",
    "model": "claude-test",
    "content": [],
    "stop_reason": None,
    "stop_sequence": None,
}


def _events(any_part: bool) -> Strategy:
    """Events shaped like the API's. Without `any_part` every part is one the API sends and only
    optional ones are left out; with it, any part may be left out, null or any JSON."""

    def shaped(kind: str | None, parts: dict[str, Strategy], required: Collection[str]) -> Strategy:
        if any_part:
            parts = {key: value | st.none() | json_values for key, value in parts.items()}
            required = ()
        given = {key: value for key, value in parts.items() if key in required}
        optional = {key: value for key, value in parts.items() if key not in required}
        fixed = {"type": st.just(kind)} if kind is not None else {}
        return st.fixed_dictionaries({**fixed, **given}, optional=optional)

    count = st.integers(0, 99)
    tokens = ("input_tokens", "output_tokens")
    cache = ("cache_read_input_tokens", "cache_creation_input_tokens")
    usage = shaped(None, {key: count for key in (*tokens, *cache)}, tokens)
    delta_usage = shaped(None, {key: count for key in (*tokens, *cache)}, ("output_tokens",))
    index = st.integers(0, 2)
    text = st.text(max_size=4)
    deltas = (
        shaped("text_delta", {"text": text}, {"text"})
        | shaped("input_json_delta", {"partial_json": text}, {"partial_json"})
        | shaped("thinking_delta", {"thinking": text}, {"thinking"})
        | shaped("signature_delta", {"signature": text}, {"signature"})
    )
    blocks = (
        shaped("text", {"text": text}, {"text"})
        | shaped(
            "tool_use", {"id": text, "name": text, "input": st.just({})}, {"id", "name", "input"}
        )
        | shaped("thinking", {"thinking": text, "signature": text}, {"thinking", "signature"})
        | shaped("redacted_thinking", {"data": text}, {"data"})
    )
    stop = shaped(None, {"stop_reason": st.sampled_from(["end_turn", "tool_use"])}, ())
    message = shaped(None, {"usage": usage}, {"usage"}).map(lambda m: {**MESSAGE, **m})
    every_part = {"index", "delta", "content_block", "usage", "message"}
    return (
        shaped("content_block_delta", {"index": index, "delta": deltas}, every_part)
        | shaped("content_block_start", {"index": index, "content_block": blocks}, every_part)
        | shaped("content_block_stop", {"index": index}, every_part)
        | shaped("message_delta", {"delta": stop, "usage": delta_usage}, every_part)
        | shaped("message_start", {"message": message}, every_part)
    )


events_ = json_values | _events(any_part=False) | _events(any_part=True)


class TypedState(_State):
    """How the provider read the SDK's typed events before it read parsed JSON."""

    def read(self, event: Any) -> list[StreamEvent]:
        if event.type == "message_start":
            self._count(event.message.usage, event)
        elif event.type == "content_block_start":
            block = event.content_block
            if block.type == "tool_use":
                self.empty_tool_blocks.add(event.index)
                return [ToolCallDelta(event.index, block.id, block.name, "")]
            if block.type == "thinking":
                thought = {"type": "thinking", "thinking": block.thinking}
                self.reasoning[event.index] = {**thought, "signature": block.signature}
                return [ReasoningDelta(event.index, block.thinking)] if block.thinking else []
            if block.type == "redacted_thinking":
                if not block.data:  # nothing to send back: not a block the API makes
                    raise ProviderError("bad_response", "an empty redacted_thinking block")
                self.reasoning[event.index] = {"type": "redacted_thinking", "data": block.data}
        elif event.type == "content_block_delta":
            delta = event.delta
            if delta.type == "text_delta" and delta.text:
                return [TextDelta(delta.text)]
            if delta.type == "input_json_delta" and delta.partial_json:
                self.empty_tool_blocks.discard(event.index)
                return [ToolCallDelta(event.index, None, None, delta.partial_json)]
            open_block = self.reasoning.get(event.index)
            if open_block is not None and open_block["type"] == "thinking":
                if delta.type == "thinking_delta":
                    open_block["thinking"] += delta.thinking
                    return [ReasoningDelta(event.index, delta.thinking)] if delta.thinking else []
                if delta.type == "signature_delta":
                    open_block["signature"] += delta.signature
        elif event.type == "content_block_stop":
            if event.index in self.reasoning:
                closed = self.reasoning.pop(event.index)
                if closed["type"] == "thinking" and not closed["signature"]:
                    raise ProviderError("bad_response", "a thinking block without its signature")
                return [ReasoningBlock(event.index, dict(closed))]
            if event.index in self.empty_tool_blocks:
                self.empty_tool_blocks.discard(event.index)
                return [ToolCallDelta(event.index, None, None, "{}")]
        elif event.type == "message_delta":
            self._count(event.usage, event)
            if event.delta.stop_reason is not None:
                self.stop_reason = event.delta.stop_reason
        return []

    def _count(self, usage: Any, event: object) -> None:
        self.input_tokens = usage.input_tokens or self.input_tokens
        self.cache_read = usage.cache_read_input_tokens or self.cache_read
        self.cache_write = usage.cache_creation_input_tokens or self.cache_write
        self.output_tokens = usage.output_tokens or self.output_tokens


TYPED_EVENT: pydantic.TypeAdapter[RawMessageStreamEvent] = pydantic.TypeAdapter(
    RawMessageStreamEvent
)


@settings(max_examples=400)
@given(st.lists(events_, min_size=1, max_size=5))
def test_any_events_are_read_as_the_sdks_types_have_them_or_are_a_bad_response(
    events: list[object],
) -> None:
    state, typed_state = _State(), TypedState()
    for event in events:
        try:
            typed: RawMessageStreamEvent | None = TYPED_EVENT.validate_python(event, strict=True)
        except pydantic.ValidationError:
            typed = None
        try:
            read = state.read(event)
        except ProviderError as error:
            assert error.kind == "bad_response"
            if typed is not None:  # beyond the API's types, only what cannot be sent back
                with pytest.raises(ProviderError):
                    typed_state.read(typed)
            return
        if typed is None:
            return  # let through, leniently; what the typed reading would make of it is moot
        assert read == typed_state.read(typed)
        assert asdict(state) == asdict(typed_state)
        assert state.usage() == typed_state.usage()


@settings(max_examples=40, suppress_health_check=list(HealthCheck))
@given(events_.filter(lambda event: not (isinstance(event, dict) and event.get("type") == "error")))
async def test_any_event_streamed_by_the_sdk_ends_well_or_as_a_bad_response(
    provider: AnthropicProvider, upstream: FakeUpstream, event: object
) -> None:
    upstream.clear()
    upstream.script(Text("Hel"), Chunk(event), Text("lo"))
    events: list[StreamEvent] = []

    try:
        await collect(provider.stream(HELLO), events)
    except ProviderError as error:
        assert error.kind == "bad_response"
        assert events[:1] == [TextDelta("Hel")]
    else:
        assert events[0] == TextDelta("Hel") and isinstance(events[-1], Finish)
