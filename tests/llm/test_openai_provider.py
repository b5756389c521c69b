"""OpenAIProvider: the real openai SDK over HTTP against the fake upstream."""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator, Collection, Iterator
from dataclasses import replace
from typing import Any, cast

import openai
import pydantic
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai.types.chat import ChatCompletionChunk

from app.core.formats import to_openai
from app.core.messages import Message, ToolCall, ToolSpec
from app.core.output_schema import ResponseFormat
from app.core.tool_choice import NamedTool, ToolChoice, openai_fields
from app.core.usage import UsageReport
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
from app.llm.openai_provider import OpenAIProvider, Read, read_chunk
from testkit.upstream import (
    Chunk,
    Fail,
    FailMidStream,
    FakeUpstream,
    Malformed,
    ReasoningContent,
    Stall,
    Step,
    Text,
    Truncate,
    Usage,
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
CONVERSATION = (
    Message("system", "You are terse."),
    Message("user", "Weather in Paris?"),
    Message("assistant", "", tool_calls=(ToolCall("call_0", "get_weather", {"city": "Paris"}),)),
    Message("tool", '{"temp": 21}', tool_call_id="call_0"),
    Message("user", "And in Rome?"),
)


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream() as up:
        yield up


@pytest.fixture
async def provider(upstream: FakeUpstream) -> AsyncIterator[OpenAIProvider]:
    upstream.clear()
    provider = OpenAIProvider("sk-test", upstream.openai_base_url, timeout=5)
    yield provider
    await provider.aclose()


HELLO = ModelRequest("gpt-test", (Message("user", "Hi"),))
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


async def test_streams_text_then_usage_then_finish(
    provider: OpenAIProvider, upstream: FakeUpstream
) -> None:
    upstream.script(Text("Hel"), Text("lo"), Usage(12, 2, cached=4))

    events = await collect(provider.stream(HELLO))

    assert events == [
        TextDelta("Hel"),
        TextDelta("lo"),
        UsageReport(input_tokens=12, output_tokens=2, cached_tokens=4),
        Finish("stop"),
    ]


async def test_reasoning_tokens_are_reported_apart_where_the_server_says(
    provider: OpenAIProvider, upstream: FakeUpstream
) -> None:
    upstream.script(Text("Hi"), Usage(12, 40, reasoning=32))

    events = await collect(provider.stream(HELLO))

    assert events[-2] == UsageReport(12, 40, reasoning_tokens=32)


async def test_a_compatible_servers_reasoning_streams_as_blocks_in_their_place(
    provider: OpenAIProvider, upstream: FakeUpstream
) -> None:
    upstream.script(
        ReasoningContent("Think", fragments=2),
        Text("Hi"),
        ReasoningContent("More", field="reasoning", fragments=1),
        Text("!"),
    )

    events = await collect(provider.stream(HELLO))

    assert events[:7] == [
        ReasoningDelta(0, "Thi"),
        ReasoningDelta(0, "nk"),
        ReasoningBlock(0, {"type": "reasoning_text", "text": "Think"}),
        TextDelta("Hi"),
        ReasoningDelta(1, "More"),
        ReasoningBlock(1, {"type": "reasoning_text", "text": "More"}),
        TextDelta("!"),
    ]


async def test_sends_the_formatted_conversation(
    provider: OpenAIProvider, upstream: FakeUpstream
) -> None:
    request = ModelRequest(
        "gpt-test", CONVERSATION, tools=(WEATHER,), max_output_tokens=50, temperature=0.2
    )

    await collect(provider.stream(request))

    [received] = upstream.requests
    wire = to_openai(CONVERSATION, (WEATHER,))
    # Servers that render a chat template (llama.cpp) answer a null content with a 500.
    assert received.body["messages"][2]["content"] == ""
    assert received.path == "/v1/chat/completions"
    assert received.headers["authorization"] == "Bearer sk-test"
    assert received.body == {
        "model": "gpt-test",
        "messages": wire["messages"],
        "tools": wire["tools"],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_completion_tokens": 50,
        "temperature": 0.2,
    }


async def test_leaves_out_what_the_request_does_not_set(
    provider: OpenAIProvider, upstream: FakeUpstream
) -> None:
    await collect(provider.stream(HELLO))

    body = upstream.requests[0].body
    assert set(body) == {"model", "messages", "stream", "stream_options"}


async def test_compat_servers_get_max_tokens(upstream: FakeUpstream) -> None:
    upstream.clear()
    provider = OpenAIProvider("none", upstream.openai_base_url, 5, legacy_max_tokens=True)
    try:
        await collect(provider.stream(replace(HELLO, max_output_tokens=64)))
    finally:
        await provider.aclose()

    body = upstream.requests[0].body
    assert body["max_tokens"] == 64
    assert "max_completion_tokens" not in body


async def test_tool_call_deltas_reassemble(
    provider: OpenAIProvider, upstream: FakeUpstream
) -> None:
    upstream.script(
        Text("Checking."),
        ScriptedCall("call_1", "get_weather", '{"city": "Rome"}', fragments=4),
        ScriptedCall("call_2", "get_weather", '{"city": "Oslo"}'),
    )

    events = await collect(provider.stream(replace(HELLO, tools=(WEATHER,))))

    assert joined_text(events) == "Checking."
    assert tool_calls(events) == [
        ("call_1", "get_weather", '{"city": "Rome"}'),
        ("call_2", "get_weather", '{"city": "Oslo"}'),
    ]
    fragments = [e for e in events if isinstance(e, ToolCallDelta) and e.index == 0]
    assert len(fragments) > 2  # streamed in pieces, not handed over whole
    assert json.loads(tool_calls(events)[0][2]) == {"city": "Rome"}
    assert events[-1] == Finish("tool_calls")


@pytest.mark.parametrize(
    ("status", "kind", "expected"),
    [
        (429, None, "rate_limited"),
        (429, "quota", "auth"),
        (500, None, "server"),
        (503, "server", "server"),
        (529, None, "overloaded"),
        (503, "overloaded", "overloaded"),  # OpenAI's "engine is overloaded"
        (400, None, "bad_request"),
        (422, "bad_request", "bad_request"),
        (401, None, "auth"),
        (403, "permission", "auth"),
        (404, None, "not_found"),
    ],
)
async def test_errors_before_output_are_classified(
    provider: OpenAIProvider,
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
        (FailMidStream("overloaded"), "overloaded"),
        (FailMidStream("server", "The server had an error"), "server"),
        (FailMidStream(disconnect=True), "connection"),
        (Truncate(), "server"),
        (Malformed(), "bad_response"),
    ],
)
async def test_failure_mid_stream_comes_after_the_deltas(
    provider: OpenAIProvider, upstream: FakeUpstream, failure: Step, expected: str
) -> None:
    upstream.script(Text("Hel"), Text("lo"), failure)
    events: list[StreamEvent] = []

    with pytest.raises(ProviderError) as caught:
        await collect(provider.stream(HELLO), events)

    assert events == [TextDelta("Hel"), TextDelta("lo")]
    assert caught.value.kind == expected
    assert caught.value.retryable


async def test_a_chunk_that_is_not_json_is_a_bad_response(
    provider: OpenAIProvider, upstream: FakeUpstream
) -> None:
    upstream.script(Malformed("{not json"))

    with pytest.raises(ProviderError) as caught:
        await collect(provider.stream(HELLO))

    assert caught.value.kind == "bad_response" and caught.value.retryable
    assert caught.value.as_error()["code"] == "provider_bad_response"
    assert "not JSON" in caught.value.message


async def test_a_silent_upstream_times_out(upstream: FakeUpstream) -> None:
    upstream.clear()
    upstream.script(Text("a"), Stall(3))
    provider = OpenAIProvider("sk-test", upstream.openai_base_url, timeout=0.3)
    events: list[StreamEvent] = []
    try:
        with pytest.raises(ProviderError) as caught:
            await collect(provider.stream(HELLO), events)
    finally:
        await provider.aclose()

    assert events == [TextDelta("a")]
    assert caught.value.kind == "timeout"


async def test_nothing_listening_is_a_connection_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again before the call: nothing listens there
    provider = OpenAIProvider("sk-test", f"http://127.0.0.1:{port}/v1", timeout=2)
    try:
        with pytest.raises(ProviderError) as caught:
            await collect(provider.stream(HELLO))
    finally:
        await provider.aclose()

    assert caught.value.kind == "connection"


async def test_a_server_that_reports_no_usage_gets_an_estimate(
    provider: OpenAIProvider, upstream: FakeUpstream
) -> None:
    upstream.script(Text("The answer is forty-two."), report_usage=False)

    events = await collect(provider.stream(ModelRequest("gpt-test", CONVERSATION)))

    usage, finish = events[-2:]
    assert isinstance(usage, UsageReport) and isinstance(finish, Finish)
    assert usage.estimated
    # The prompt holds five messages, the answer six or so tokens: counted, not left at 0.
    assert usage.input_tokens > 20
    assert 3 <= usage.output_tokens <= 12
    reported = await collect(provider.stream(HELLO))
    assert not next(e for e in reported if isinstance(e, UsageReport)).estimated


async def test_compat_answers_are_capped_by_the_room_left_and_the_endpoint_limit(
    upstream: FakeUpstream,
) -> None:
    upstream.clear()
    roomy = replace(HELLO, answer_room=300)
    capped = OpenAIProvider(
        "none", upstream.openai_base_url, 5, legacy_max_tokens=True, answer_in_room=True
    )
    limited = OpenAIProvider(
        "none",
        upstream.openai_base_url,
        5,
        legacy_max_tokens=True,
        answer_in_room=True,
        output_limit=100,
    )
    try:
        await collect(capped.stream(roomy))
        await collect(limited.stream(roomy))
        await collect(limited.stream(replace(roomy, max_output_tokens=40)))
    finally:
        await capped.aclose()
        await limited.aclose()

    assert [r.body["max_tokens"] for r in upstream.requests] == [300, 100, 40]


@pytest.mark.parametrize(
    ("choice", "parallel", "sent"),
    [
        ("none", True, {"tool_choice": "none"}),
        ("required", True, {"tool_choice": "required"}),
        (
            NamedTool("get_weather"),
            False,
            {
                "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
                "parallel_tool_calls": False,
            },
        ),
        ("auto", False, {"parallel_tool_calls": False}),
        ("auto", True, {}),
    ],
)
async def test_tool_choice_and_parallel_calls_go_out_as_chat_completions_fields(
    provider: OpenAIProvider,
    upstream: FakeUpstream,
    choice: ToolChoice,
    parallel: bool,
    sent: dict[str, object],
) -> None:
    request = replace(HELLO, tools=(WEATHER,), tool_choice=choice, parallel_tool_calls=parallel)

    await collect(provider.stream(request))

    body = upstream.requests[0].body
    assert {k: body[k] for k in ("tool_choice", "parallel_tool_calls") if k in body} == sent
    assert body["tools"] == to_openai((), (WEATHER,))["tools"]


async def test_no_tool_choice_goes_out_without_tools(
    provider: OpenAIProvider, upstream: FakeUpstream
) -> None:
    # OpenAI answers 400 to tool_choice or parallel_tool_calls in a request without tools.
    await collect(provider.stream(replace(HELLO, tool_choice="none", parallel_tool_calls=False)))

    assert not {"tools", "tool_choice", "parallel_tool_calls"} & set(upstream.requests[0].body)


# --- The body, and chunks read as parsed JSON -------------------------------------------------


@pytest.mark.parametrize(
    ("options", "request_"),
    [
        ({}, HELLO),
        ({}, ModelRequest("gpt-test", CONVERSATION, (WEATHER,), 50, 0.2)),
        (
            {"send_cache_key": True},
            replace(
                HELLO,
                tools=(WEATHER,),
                tool_choice=NamedTool("get_weather"),
                parallel_tool_calls=False,
                cache_key="threadline-s1",
                temperature=0.0,
                max_output_tokens=7,
            ),
        ),
        ({"send_cache_key": True}, replace(HELLO, tools=(WEATHER,), tool_choice="required")),
        (
            {"legacy_max_tokens": True, "answer_in_room": True, "output_limit": 100},
            replace(HELLO, answer_room=300, cache_key="ignored-here"),
        ),
        ({"send_cache_key": True}, replace(HELLO, cache_key="s", response_format=STRUCTURED)),
        (  # as a compat endpoint (llama.cpp server, vLLM) is asked
            {"legacy_max_tokens": True, "answer_in_room": True},
            replace(HELLO, tools=(WEATHER,), answer_room=50, response_format=STRUCTURED),
        ),
    ],
)
async def test_the_body_is_the_one_the_sdks_create_sends(
    upstream: FakeUpstream, options: dict[str, Any], request_: ModelRequest
) -> None:
    upstream.clear()
    provider = OpenAIProvider("sk-test", upstream.openai_base_url, 5, **options)
    client = openai.AsyncOpenAI(
        api_key="sk-test", base_url=upstream.openai_base_url, max_retries=0, timeout=5
    )
    try:
        await collect(provider.stream(request_))
        # What the provider sent before it posted by itself: the same fields through create().
        wire = to_openai(request_.messages, request_.tools)
        cap = provider._output_cap(request_)
        legacy = options.get("legacy_max_tokens", False)
        choice = openai_fields(request_.tool_choice, request_.parallel_tool_calls, "tools" in wire)
        cache_key = request_.cache_key if options.get("send_cache_key") else None
        omit = openai.omit
        chunks = await client.chat.completions.create(
            model=request_.model,
            messages=wire["messages"],
            tools=wire.get("tools", omit),
            temperature=request_.temperature if request_.temperature is not None else omit,
            stream=True,
            stream_options={"include_usage": True},
            max_completion_tokens=omit if legacy or cap is None else cap,
            max_tokens=cap if legacy and cap is not None else omit,
            prompt_cache_key=cache_key if cache_key is not None else omit,
            tool_choice=choice.get("tool_choice", omit),
            parallel_tool_calls=choice.get("parallel_tool_calls", omit),
            response_format=cast(Any, request_.response_format.as_json())
            if request_.response_format is not None
            else omit,
        )
        async with chunks:
            async for _ in chunks:
                pass
    finally:
        await provider.aclose()
        await client.close()

    ours, sdks = upstream.requests
    assert ours.path == sdks.path
    assert ours.headers == sdks.headers  # auth, lengths: all the same
    assert ours.headers["authorization"] == "Bearer sk-test"
    assert ours.body == sdks.body
    assert list(ours.body) == list(sdks.body)  # in the same order too


@pytest.mark.parametrize("kind", ["overloaded", "rate_limit", "server", "bad_request"])
async def test_an_error_chunk_in_a_200_stream_is_classified_with_its_message(
    provider: OpenAIProvider, upstream: FakeUpstream, kind: str
) -> None:
    upstream.script(Text("Hel"), FailMidStream(kind, f"the {kind} words"))
    events: list[StreamEvent] = []

    with pytest.raises(ProviderError) as caught:
        await collect(provider.stream(HELLO), events)

    assert events == [TextDelta("Hel")]
    expected = {"rate_limit": "rate_limited", "bad_request": "bad_request"}.get(kind, kind)
    assert (caught.value.kind, caught.value.message) == (expected, f"the {kind} words")


BASE_CHUNK = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "gpt-test"}


def _choice(index: int = 0, finish: str | None = None, **delta: Any) -> dict[str, Any]:
    return {"index": index, "delta": delta, "finish_reason": finish}


async def test_chunks_the_api_may_send_are_read_as_before(
    provider: OpenAIProvider, upstream: FakeUpstream
) -> None:
    call = {"index": 0, "id": "call_9", "type": "function", "function": {"name": "f"}}
    upstream.script(
        Chunk({**BASE_CHUNK, "choices": []}),  # Azure's first chunk: nothing in it
        Chunk({**BASE_CHUNK, "choices": [_choice(content="a")], "usage": None}),
        Chunk({**BASE_CHUNK, "choices": [_choice(1, content="other choice")]}),
        Chunk({**BASE_CHUNK, "choices": [_choice(content=None, refusal=None)]}),
        Chunk({**BASE_CHUNK, "choices": [{"index": 0, "delta": {"tool_calls": [call]}}]}),
        Chunk({**BASE_CHUNK, "choices": [_choice(tool_calls=[{"index": 0, "function": None}])]}),
        Chunk(
            {
                **BASE_CHUNK,
                "choices": [
                    _choice(tool_calls=[{"index": 0, "function": {"arguments": '{"x": 1}'}}])
                ],
            }
        ),
        Chunk({**BASE_CHUNK, "choices": [_choice(finish="length")]}),
        Chunk(
            {
                **BASE_CHUNK,
                "choices": [],
                "usage": {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12},
            }
        ),
        Truncate(),
    )

    events = await collect(provider.stream(HELLO))

    assert events == [
        TextDelta("a"),
        ToolCallDelta(0, "call_9", "f", ""),
        ToolCallDelta(0, None, None, ""),
        ToolCallDelta(0, None, None, '{"x": 1}'),
        UsageReport(9, 3, 0),  # no prompt_tokens_details: nothing cached
        Finish("length"),
    ]


@pytest.mark.parametrize(
    "chunk",
    [
        None,
        [],
        "text",
        {**BASE_CHUNK, "choices": {"index": 0}},
        {**BASE_CHUNK, "choices": [None]},
        {**BASE_CHUNK, "choices": [{"delta": {"content": "no index"}}]},
        {**BASE_CHUNK, "choices": [_choice(content=5)]},
        {**BASE_CHUNK, "choices": [{"index": 0, "delta": ["content"]}]},
        {**BASE_CHUNK, "choices": [_choice(tool_calls=[{"function": {"name": "f"}}])]},
        {**BASE_CHUNK, "choices": [_choice(tool_calls={"index": 0})]},
        {**BASE_CHUNK, "choices": [_choice(finish=1)]},  # type: ignore[arg-type]
        {**BASE_CHUNK, "choices": [], "usage": {"prompt_tokens": 1}},
        {**BASE_CHUNK, "choices": [], "usage": {"prompt_tokens": "1", "completion_tokens": 1}},
        {
            **BASE_CHUNK,
            "choices": [],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "prompt_tokens_details": 3},
        },
    ],
)
async def test_a_chunk_of_the_wrong_shape_is_a_bad_response(
    provider: OpenAIProvider, upstream: FakeUpstream, chunk: object
) -> None:
    upstream.script(Text("Hel"), Chunk(chunk), Text("lo"))
    events: list[StreamEvent] = []

    with pytest.raises(ProviderError) as caught:
        await collect(provider.stream(HELLO), events)

    assert events == [TextDelta("Hel")]
    assert caught.value.kind == "bad_response" and caught.value.retryable
    assert caught.value.as_error()["code"] == "provider_bad_response"


# Any JSON, and chunks shaped like the API's whose every part may be missing, null or any JSON.
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=6,
)


def _chunks(any_part: bool) -> Strategy:
    """Chunks shaped like the API's. Without `any_part`, every part is what the API sends and
    only optional ones are left out (chunks its own type takes); with it, any part may be left
    out, null or any JSON."""

    def shaped(parts: dict[str, Strategy], required: Collection[str] = ()) -> Strategy:
        if any_part:
            parts = {key: value | st.none() | json_values for key, value in parts.items()}
            return st.fixed_dictionaries({}, optional=parts)
        given = {key: value for key, value in parts.items() if key in required}
        optional = {key: value for key, value in parts.items() if key not in required}
        return st.fixed_dictionaries(given, optional=optional)

    function = shaped({"name": st.text(max_size=4), "arguments": st.text(max_size=4)})
    call = shaped(
        {"index": st.integers(0, 2), "id": st.text(max_size=4), "function": function}, {"index"}
    )
    delta = shaped(
        {
            "role": st.just("assistant"),
            "content": st.text(max_size=4),
            "tool_calls": st.lists(call, max_size=2),
        }
    )
    finish = st.sampled_from(["stop", "length", "tool_calls", "content_filter"])
    choice = shaped(
        {"index": st.integers(0, 1), "delta": delta, "finish_reason": finish}, {"index", "delta"}
    )
    details = shaped({"cached_tokens": st.integers(0, 99)})
    output_details = shaped({"reasoning_tokens": st.integers(0, 99)})
    counts = {k: st.integers(0, 99) for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
    usage = shaped(
        {**counts, "prompt_tokens_details": details, "completion_tokens_details": output_details},
        counts,
    )
    chunk = shaped({"choices": st.lists(choice, max_size=2), "usage": usage}, {"choices"})
    return st.builds(lambda parts: {**BASE_CHUNK, **parts}, chunk)


Strategy = st.SearchStrategy[Any]
chunks = json_values | _chunks(any_part=False) | _chunks(any_part=True)


def typed_reading(chunk: ChatCompletionChunk) -> Read:
    """How the provider read the SDK's typed chunks before it read parsed JSON."""
    events: list[TextDelta | ReasoningDelta | ToolCallDelta | Finish] = []
    for choice in chunk.choices:
        if choice.index != 0:
            continue
        delta = choice.delta
        if delta.content:
            events.append(TextDelta(delta.content))
        for call in delta.tool_calls or ():
            function = call.function
            name = function.name if function else None
            arguments = (function.arguments or "") if function else ""
            events.append(ToolCallDelta(call.index, call.id, name, arguments))
        if choice.finish_reason is not None:
            events.append(Finish(choice.finish_reason))
    usage = chunk.usage
    if usage is None:
        return events, None
    details = usage.prompt_tokens_details
    cached = (details.cached_tokens or 0) if details is not None else 0
    output = usage.completion_tokens_details
    reasoning = (output.reasoning_tokens or 0) if output is not None else 0
    return events, UsageReport(
        usage.prompt_tokens, usage.completion_tokens, cached, reasoning_tokens=reasoning
    )


@settings(max_examples=500)
@given(chunks)
def test_any_chunk_is_read_as_the_sdks_type_has_it_or_is_a_bad_response(chunk: object) -> None:
    try:
        typed = ChatCompletionChunk.model_validate(chunk, strict=True)
    except pydantic.ValidationError:
        typed = None
    try:
        read = read_chunk(chunk)
    except ProviderError as error:
        assert error.kind == "bad_response"
        assert typed is None  # only what the API's own type refuses is refused
        return
    if typed is not None:
        assert read == typed_reading(typed)
    events, usage = read
    for event in events:  # whatever was let through has the types the rest relies on
        if isinstance(event, TextDelta):
            assert type(event.text) is str and event.text
        elif isinstance(event, ToolCallDelta):
            assert type(event.index) is int and type(event.arguments) is str
            assert all(v is None or type(v) is str for v in (event.id, event.name))
        elif isinstance(event, ReasoningDelta):
            assert type(event.text) is str and event.text
        else:
            assert type(event.reason) is str
    if usage is not None:
        assert all(type(n) is int for n in (usage.input_tokens, usage.output_tokens))
        assert type(usage.cached_tokens) is int


@settings(max_examples=40, suppress_health_check=list(HealthCheck))
@given(chunks.filter(lambda chunk: not (isinstance(chunk, dict) and chunk.get("error"))))
async def test_any_chunk_streamed_by_the_sdk_ends_well_or_as_a_bad_response(
    provider: OpenAIProvider, upstream: FakeUpstream, chunk: object
) -> None:
    upstream.clear()
    upstream.script(Text("Hel"), Chunk(chunk), Text("lo"))
    events: list[StreamEvent] = []

    try:
        await collect(provider.stream(HELLO), events)
    except ProviderError as error:
        assert error.kind == "bad_response"
        assert events[:1] == [TextDelta("Hel")]
    else:
        assert events[0] == TextDelta("Hel") and isinstance(events[-1], Finish)
