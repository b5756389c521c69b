"""Reasoning in the projection: a model's thinking goes back only within the tool loop it
belongs to (the newest turn), byte for byte and in its place, and only to a provider that takes
it (Anthropic); older turns' thinking is left out and counts for nothing."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.content import ANTHROPIC_REASONING, is_reasoning
from app.core.entries import PendingEntry
from app.core.formats import to_anthropic, to_openai
from app.core.messages import Message
from app.core.policy import ContextPolicy
from app.core.projection import ContextOverflow
from app.core.tokens import request_tokens
from tests.core.format_oracles import validate_anthropic, validate_openai
from tests.core.test_projection import O200K, Journal

THOUGHT = {"type": "thinking", "thinking": "The user wants the time.", "signature": "c2ln=="}
HIDDEN = {"type": "redacted_thinking", "data": "ZW5jcnlwdGVk"}


def thinking(text: str, n: int) -> dict[str, Any]:
    return {"type": "thinking", "thinking": text, "signature": f"sig{n}=="}


def reasoning_of(message: Message) -> list[dict[str, Any]]:
    content = message.content
    return [] if isinstance(content, str) else [p for p in content if is_reasoning(p)]


def test_the_current_loops_thinking_goes_back_and_older_turns_does_not() -> None:
    j = Journal()
    j.user("What time is it?")
    j.add(
        "message",
        {"role": "assistant", "content": [THOUGHT, {"type": "text", "text": "Checking."}]},
        call_id="t1",
    )
    j.call("call_1", "now", turn="t1")
    j.result("call_1", "12:00", turn="t1")
    j.add("message", {"role": "assistant", "content": [thinking("Noon.", 2), _text("Noon.")]})
    j.user("And in Tokyo?")
    j.add("message", {"role": "assistant", "content": [HIDDEN]}, call_id="t2")
    j.call("call_2", "now", turn="t2", tz="Asia/Tokyo")
    j.result("call_2", "21:00", turn="t2")

    sent = j.project(reasoning_sent=ANTHROPIC_REASONING)
    plain = j.project()

    assistants = [m for m in sent.messages if m.role == "assistant"]
    assert [reasoning_of(m) for m in assistants] == [[], [], [HIDDEN]]
    assert assistants[0].content == ({"type": "text", "text": "Checking."},)
    assert assistants[2].content == (HIDDEN,)  # nothing else: not a placeholder
    assert all(not reasoning_of(m) for m in plain.messages)
    assert plain.messages[-2].content == ""  # the loop's turn without its reasoning
    wire = to_anthropic(sent.messages, sent.tool_spec)
    assert wire["messages"][-2]["content"][0] == HIDDEN
    assert validate_anthropic(wire) == []
    # What is sent is what is counted: the redacted block, and no older thinking.
    assert sent.meta.estimated_tokens > plain.meta.estimated_tokens
    assert request_tokens(sent.messages, sent.tool_spec, O200K) == sent.meta.estimated_tokens
    assert request_tokens(plain.messages, plain.tool_spec, O200K) == plain.meta.estimated_tokens


def test_a_new_ask_ends_the_loop_its_thinking_stays_behind() -> None:
    j = Journal()
    j.user("What time is it?")
    j.add("message", {"role": "assistant", "content": [THOUGHT, _text("Noon.")]})

    during = j.project(reasoning_sent=ANTHROPIC_REASONING)
    after = j.project(
        reasoning_sent=ANTHROPIC_REASONING,
        pending=[PendingEntry("message", {"role": "user", "content": "Thanks"})],
    )

    assert reasoning_of(during.messages[-1]) == [THOUGHT]
    assert not any(reasoning_of(m) for m in after.messages)


def test_a_loop_left_without_an_answer_keeps_its_thinking_for_the_next_ask() -> None:
    """A fork inside a tool loop, or a run stopped in one: the next user message goes out with
    the loop's results (one user message), so Anthropic wants the loop's thinking back."""
    j = Journal()
    j.user("Two times three?")
    j.add("message", {"role": "assistant", "content": [THOUGHT, _text("Computing.")]}, call_id="t")
    j.call("call_1", "calculator", turn="t", expression="2*3")
    j.result("call_1", 6, turn="t")

    p = j.project(
        reasoning_sent=ANTHROPIC_REASONING,
        pending=[PendingEntry("message", {"role": "user", "content": "Hi"})],
    )

    wire = to_anthropic(p.messages, p.tool_spec)["messages"]
    assert [b["type"] for b in wire[-1]["content"]] == ["tool_result", "text"]
    assert wire[-2]["content"][0] == THOUGHT
    assert validate_anthropic({"messages": wire}) == []
    assert request_tokens(p.messages, p.tool_spec, O200K) == p.meta.estimated_tokens


@st.composite
def reasoning_journals(draw: st.DrawFn) -> tuple[Journal, list[PendingEntry]]:
    """Turns whose model turns think (thinking and redacted blocks, with or without text),
    call tools or answer."""
    j = Journal()
    n = 0
    for turn in range(draw(st.integers(1, 6))):
        j.user(draw(st.sampled_from(["hi", "what now?", "tell me more " * 30])) + f" #{turn}")
        for round_ in range(draw(st.integers(0, 3))):
            turn_id = f"t{turn}.{round_}"
            content: list[dict[str, Any]] = []
            for _ in range(draw(st.integers(0, 2))):
                n += 1
                block = draw(st.sampled_from(["thinking", "redacted", "long"]))
                if block == "redacted":
                    content.append({"type": "redacted_thinking", "data": f"ZGF0YQ{n}=="})
                else:
                    words = "step by step " * (300 if block == "long" else 2)
                    content.append(thinking(f"{words}#{n}", n))
            if draw(st.booleans()):
                content.append(_text(f"calling #{turn_id}"))
            if content:
                j.add("message", {"role": "assistant", "content": content}, call_id=turn_id)
            n += 1
            j.call(f"call_{n}", "search", turn=turn_id, q=n)
            if draw(st.integers(0, 4)):
                j.result(f"call_{n}", {"value": n}, turn=turn_id)
        if draw(st.booleans()):
            n += 1
            j.add("message", {"role": "assistant", "content": [thinking("so", n), _text("done")]})
    pending = (
        [PendingEntry("message", {"role": "user", "content": "the new ask"})]
        if draw(st.booleans())
        else []
    )
    return j, pending


@settings(max_examples=120)
@given(
    reasoning_journals(),
    st.builds(
        ContextPolicy,
        max_input_tokens=st.integers(1500, 30_000),
        reserve_output_tokens=st.integers(0, 1000),
        keep_last_turns=st.integers(0, 3),
        summarization=st.just("none"),
    ),
)
def test_reasoning_goes_back_whole_and_only_within_the_newest_turn(
    generated: tuple[Journal, list[PendingEntry]], policy: ContextPolicy
) -> None:
    j, pending = generated
    try:
        sent = j.project(policy=policy, pending=pending, reasoning_sent=ANTHROPIC_REASONING)
        plain = j.project(policy=policy, pending=pending)
    except ContextOverflow:
        return
    # Only to a provider that takes it back: none otherwise, and OpenAI's wire is valid.
    assert not any(reasoning_of(m) for m in plain.messages)
    assert validate_openai(to_openai(sent.messages, sent.tool_spec)) == []
    # Within the newest turn's tool loop (after the last user message, and the loop it
    # continues when that one was left without an answer), every assistant message carries
    # its entry's reasoning unchanged and in its place; before it, none.
    users = [i for i, m in enumerate(sent.messages) if m.role == "user"]
    newest = users[-1] if users else 0
    while newest and (
        sent.messages[newest - 1].role == "tool" or sent.messages[newest - 1].tool_calls
    ):
        newest -= 1
    stored = [
        e.payload["content"]
        for e in j.entries
        if e.kind == "message" and e.payload["role"] == "assistant"
    ]
    for at, message in enumerate(sent.messages):
        if message.role != "assistant":
            continue
        if at < newest:
            assert not reasoning_of(message)
        elif not isinstance(message.content, str):
            assert list(message.content) in stored
    wire = to_anthropic(sent.messages, sent.tool_spec)
    assert validate_anthropic(wire) == []
    # Counted as sent: kept reasoning adds its tokens, left-out reasoning none.
    assert request_tokens(sent.messages, sent.tool_spec, O200K) == sent.meta.estimated_tokens
    assert request_tokens(plain.messages, plain.tool_spec, O200K) == plain.meta.estimated_tokens
    if not sent.meta.truncated:  # (else the larger turns may leave older history out)
        assert sent.meta.estimated_tokens >= plain.meta.estimated_tokens
    assert j.project(policy=policy, pending=pending, reasoning_sent=ANTHROPIC_REASONING) == sent


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}
