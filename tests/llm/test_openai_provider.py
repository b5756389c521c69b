"""OpenAIProvider: the real openai SDK over HTTP against the fake upstream."""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace

import pytest

from app.core.formats import to_openai
from app.core.messages import Message, ToolCall, ToolSpec
from app.core.tool_choice import NamedTool, ToolChoice
from app.llm.base import (
    Finish,
    ModelRequest,
    ProviderError,
    StreamEvent,
    TextDelta,
    ToolCallDelta,
    UsageReport,
)
from app.llm.openai_provider import OpenAIProvider
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
