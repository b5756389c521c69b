"""AnthropicProvider's extended thinking: the real anthropic SDK over HTTP against the fake
upstream, which streams thinking as the API does and checks it when it comes back."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import anthropic
import pytest

from app.core.formats import to_anthropic
from app.core.messages import Message, ToolCall, ToolSpec
from app.core.reasoning import DEFAULT_ANSWER_TOKENS, EFFORT_BUDGETS, Reasoning
from app.core.usage import UsageReport
from app.llm.anthropic_provider import AnthropicProvider
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
from testkit.upstream import Chunk, FakeUpstream, RedactedThinking, Text, Thinking, Usage
from testkit.upstream import ToolCall as ScriptedCall
from tests.llm.streamed import collect

CLOCK = ToolSpec("now", "The time.")
QUESTION = (Message("user", "What time is it?"),)
HIGH = Reasoning(effort="high")
MODEL = "claude-sonnet-4-5"
TWO_THOUGHTS_THEN_A_CALL = (
    Thinking("First."),
    Thinking("Second."),
    Text("On it."),
    ScriptedCall("toolu_1", "now", "{}"),
)


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


def _parts(events: list[StreamEvent]) -> list[dict[str, Any]]:
    return [e.part for e in events if isinstance(e, ReasoningBlock)]


def _assistant(events: list[StreamEvent], call_id: str = "toolu_1") -> Message:
    """The assistant turn as the journal keeps it: its reasoning and text in stream order."""
    content: list[dict[str, Any]] = []
    for event in events:
        if isinstance(event, ReasoningBlock):
            content.append(event.part)
        elif isinstance(event, TextDelta):
            content.append({"type": "text", "text": event.text})
    return Message("assistant", tuple(content), tool_calls=(ToolCall(call_id, "now", {}),))


def _loop(assistant: Message, call_id: str = "toolu_1") -> tuple[Message, ...]:
    return (*QUESTION, assistant, Message("tool", "12:00", tool_call_id=call_id))


async def test_sends_thinking_with_max_tokens_above_the_budget(
    provider: AnthropicProvider, upstream: FakeUpstream
) -> None:
    request = ModelRequest("claude-sonnet-4-5", QUESTION, max_output_tokens=300, reasoning=HIGH)

    await collect(provider.stream(request))

    [received] = upstream.requests
    budget = EFFORT_BUDGETS["high"]
    assert received.body["thinking"] == {"type": "enabled", "budget_tokens": budget}
    assert received.body["max_tokens"] == budget + 300
    budgeted = Reasoning(budget_tokens=2000)
    await collect(provider.stream(ModelRequest("claude-sonnet-4-5", QUESTION, reasoning=budgeted)))
    assert upstream.requests[1].body["thinking"]["budget_tokens"] == 2000
    assert upstream.requests[1].body["max_tokens"] == 2000 + DEFAULT_ANSWER_TOKENS


async def test_without_reasoning_no_thinking_is_asked(
    provider: AnthropicProvider, upstream: FakeUpstream
) -> None:
    await collect(provider.stream(ModelRequest("claude-sonnet-4-5", QUESTION)))

    assert "thinking" not in upstream.requests[0].body


async def test_streams_thinking_pieces_then_each_block_whole_in_order(
    provider: AnthropicProvider, upstream: FakeUpstream
) -> None:
    upstream.script(
        Thinking("Let me check the clock.", fragments=3),
        RedactedThinking("secret"),
        Text("Checking."),
        ScriptedCall("toolu_1", "now", "{}"),
        Usage(20, 9),
    )
    request = ModelRequest("claude-sonnet-4-5", QUESTION, tools=(CLOCK,), reasoning=HIGH)

    events = await collect(provider.stream(request))

    pieces = [e for e in events if isinstance(e, ReasoningDelta)]
    assert {p.index for p in pieces} == {0}
    assert "".join(p.text for p in pieces) == "Let me check the clock."
    thinking, redacted = _parts(events)
    assert thinking["type"] == "thinking"
    assert thinking["thinking"] == "Let me check the clock."
    assert thinking["signature"]
    assert redacted["type"] == "redacted_thinking" and redacted["data"]
    blocks = [e.index for e in events if isinstance(e, ReasoningBlock)]
    text = [e for e in events if isinstance(e, TextDelta)]
    calls = [e for e in events if isinstance(e, ToolCallDelta)]
    assert blocks == [0, 1] and text == [TextDelta("Checking.")] and calls[0].index == 3
    # Each block whole once closed: after its own pieces, before the next block's.
    kinds = [type(e).__name__ for e in events]
    assert kinds.index("ReasoningBlock") > max(
        i for i, k in enumerate(kinds) if k == "ReasoningDelta"
    )
    assert kinds.index("TextDelta") > kinds.index("ReasoningBlock")
    assert events[-2:] == [UsageReport(20, 9), Finish("tool_use")]


async def test_the_turn_sent_back_unchanged_is_accepted(
    provider: AnthropicProvider, upstream: FakeUpstream
) -> None:
    upstream.script(*TWO_THOUGHTS_THEN_A_CALL)
    first = ModelRequest("claude-sonnet-4-5", QUESTION, tools=(CLOCK,), reasoning=HIGH)
    turn = _assistant(await collect(provider.stream(first)))

    upstream.script(Text("It is noon."))
    events = await collect(provider.stream(_with(first, _loop(turn))))

    assert [e for e in events if isinstance(e, TextDelta)] == [TextDelta("It is noon.")]
    sent = upstream.requests[1].body["messages"][1]["content"]
    assert [b["type"] for b in sent] == ["thinking", "thinking", "text", "tool_use"]
    assert sent[:2] == [p for p in turn.content[:2] if isinstance(p, dict)]


@pytest.mark.parametrize("change", ["reordered", "altered", "one_left_out"])
async def test_a_turn_sent_back_changed_is_refused_as_anthropic_does(
    provider: AnthropicProvider, upstream: FakeUpstream, change: str
) -> None:
    upstream.script(*TWO_THOUGHTS_THEN_A_CALL)
    first = ModelRequest("claude-sonnet-4-5", QUESTION, tools=(CLOCK,), reasoning=HIGH)
    turn = _assistant(await collect(provider.stream(first)))
    one, two, text = turn.content[0], turn.content[1], turn.content[2]
    assert isinstance(one, dict) and isinstance(two, dict) and isinstance(text, dict)
    changed = {
        "reordered": (two, one, text),
        "altered": ({**one, "thinking": "First!"}, two, text),
        "one_left_out": (one, text),
    }[change]

    with pytest.raises(ProviderError) as raised:
        await collect(provider.stream(_with(first, _loop(_content(turn, changed)))))

    assert raised.value.kind == "bad_request" and raised.value.status == 400
    assert "Invalid `signature`" in raised.value.message


async def test_the_fake_refuses_a_loop_whose_thinking_is_missing_as_anthropic_does(
    provider: AnthropicProvider, upstream: FakeUpstream
) -> None:
    """Straight through the SDK (the provider would ask without thinking then)."""
    upstream.script(*TWO_THOUGHTS_THEN_A_CALL)
    first = ModelRequest(MODEL, QUESTION, tools=(CLOCK,), reasoning=HIGH)
    turn = _assistant(await collect(provider.stream(first)))
    assert isinstance(turn.content, tuple)
    wire = to_anthropic(_loop(_content(turn, turn.content[2:])), (CLOCK,))
    client = anthropic.AsyncAnthropic(api_key="sk-ant-test", base_url=upstream.url, max_retries=0)

    with pytest.raises(anthropic.BadRequestError) as raised:
        await client.messages.create(
            model="claude-test",  # the fake does not mind; the SDK warns of retired names
            max_tokens=5000,
            messages=wire["messages"],
            tools=wire["tools"],
            thinking={"type": "enabled", "budget_tokens": 4096},
            stream=True,
        )
    await client.close()

    assert raised.value.status_code == 400
    assert raised.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert "Expected `thinking` or `redacted_thinking`" in raised.value.message


async def test_a_loop_that_began_without_thinking_goes_on_without_it(
    provider: AnthropicProvider, upstream: FakeUpstream
) -> None:
    """Reasoning turned on in the middle of a tool loop (a run stopped in it, then an ask
    with reasoning): its turn has no thinking to send back, which the API would refuse."""
    said = Message("assistant", "Checking.", tool_calls=(ToolCall("toolu_1", "now", {}),))
    upstream.script(Text("It is noon."))
    upstream.script(Text("It is noon."))

    events = await collect(provider.stream(ModelRequest(MODEL, _loop(said), reasoning=HIGH)))
    asked = await collect(provider.stream(ModelRequest(MODEL, QUESTION, reasoning=HIGH)))

    assert TextDelta("It is noon.") in events and TextDelta("It is noon.") in asked
    assert "thinking" not in upstream.requests[0].body
    assert upstream.requests[1].body["thinking"]["type"] == "enabled"  # no loop: asked


async def test_a_thinking_block_without_its_signature_is_a_bad_response(
    provider: AnthropicProvider, upstream: FakeUpstream
) -> None:
    start = {"type": "thinking", "thinking": "", "signature": ""}
    upstream.script(
        Chunk({"type": "content_block_start", "index": 0, "content_block": start}),
        Chunk(
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "thinking_delta", "thinking": "Hmm."},
            }
        ),
        Chunk({"type": "content_block_stop", "index": 0}),
    )
    request = ModelRequest("claude-sonnet-4-5", QUESTION, reasoning=HIGH)

    with pytest.raises(ProviderError) as raised:
        await collect(provider.stream(request))

    assert raised.value.kind == "bad_response"


async def test_a_signature_piece_of_no_thinking_block_is_skipped_and_one_not_text_refused(
    provider: AnthropicProvider, upstream: FakeUpstream
) -> None:
    def signed(signature: object) -> Chunk:
        delta = {"type": "signature_delta", "signature": signature}
        return Chunk({"type": "content_block_delta", "index": 0, "delta": delta})

    upstream.script(Text("Hi"), signed("abc"))
    upstream.script(Text("Hi"), signed(42))

    events = await collect(provider.stream(ModelRequest("claude-sonnet-4-5", QUESTION)))
    with pytest.raises(ProviderError) as raised:
        await collect(provider.stream(ModelRequest("claude-sonnet-4-5", QUESTION)))

    assert events[0] == TextDelta("Hi") and not _parts(events)
    assert raised.value.kind == "bad_response"


def _with(request: ModelRequest, messages: tuple[Message, ...]) -> ModelRequest:
    return ModelRequest(request.model, messages, tools=request.tools, reasoning=request.reasoning)


def _content(message: Message, content: tuple[Any, ...]) -> Message:
    return Message(message.role, content, tool_calls=message.tool_calls)


INTERLEAVED = (
    Thinking("Check the clock first."),
    ScriptedCall("toolu_1", "now", "{}"),
    Thinking("Then the calendar."),
    ScriptedCall("toolu_2", "now", '{"calendar": true}'),
)


@pytest.mark.parametrize(
    ("model", "interleaved"), [("claude-sonnet-4-5", True), ("claude-3-7-sonnet-latest", False)]
)
async def test_a_model_that_can_thinks_between_its_tool_calls(
    provider: AnthropicProvider, upstream: FakeUpstream, model: str, interleaved: bool
) -> None:
    """Interleaved thinking (the Claude 4 family, by its beta header): a thought between two
    tool calls streams and is kept whole, in order; a model without it thinks before only."""
    upstream.script(*INTERLEAVED)
    request = ModelRequest(model, QUESTION, tools=(CLOCK,), reasoning=HIGH)

    events = await collect(provider.stream(request))

    beta = upstream.requests[-1].headers.get("anthropic-beta")
    assert (beta == "interleaved-thinking-2025-05-14") is interleaved
    thoughts = [p["thinking"] for p in _parts(events)]
    expected = ["Check the clock first.", "Then the calendar."] if interleaved else thoughts[:1]
    assert thoughts == expected and thoughts[0] == "Check the clock first."
    calls = sorted({e.index for e in events if isinstance(e, ToolCallDelta)})
    blocks = [e.index for e in events if isinstance(e, ReasoningBlock)]
    assert blocks == ([0, 2] if interleaved else [0]) and calls == (
        [1, 3] if interleaved else [1, 2]
    )


async def test_no_beta_header_without_tools_or_without_reasoning(
    provider: AnthropicProvider, upstream: FakeUpstream
) -> None:
    await collect(provider.stream(ModelRequest(MODEL, QUESTION, reasoning=HIGH)))
    await collect(provider.stream(ModelRequest(MODEL, QUESTION, tools=(CLOCK,))))
    assert [r.headers.get("anthropic-beta") for r in upstream.requests] == [None, None]
