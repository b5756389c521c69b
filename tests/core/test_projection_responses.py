"""Reasoning in the projection for OpenAI's Responses API: its reasoning items go back byte for
byte within the open tool loop (since the last user message, and the loop that one continues),
in their order among the turn's text and function calls; older turns' are left out and count for
nothing; other providers' reasoning (Anthropic's thinking, a compatible server's readable
reasoning) is never sent."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.content import OPENAI_REASONING, content_problems, is_reasoning
from app.core.entries import PendingEntry
from app.core.formats import to_openai_responses
from app.core.policy import ContextPolicy
from app.core.projection import ContextOverflow
from app.core.tokens import request_tokens
from tests.core.test_projection import O200K, Journal


def item(n: int, summary: str = "") -> dict[str, Any]:
    """A stored Responses reasoning item (as the provider journals it)."""
    said = [{"type": "summary_text", "text": summary}] if summary else []
    return {
        "type": "reasoning",
        "id": f"rs_{n}",
        "encrypted_content": f"gAAA{n}==",
        "summary": said,
    }


def wire_item(part: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "reasoning",
        "id": part["id"],
        "summary": part["summary"],
        "encrypted_content": part["encrypted_content"],
    }


def test_the_open_loops_items_go_back_in_their_place() -> None:
    j = Journal()
    j.user("What time is it?")
    j.add(
        "message",
        {"role": "assistant", "content": [item(1, "Look it up."), _text("Checking."), item(2)]},
        call_id="t1",
    )
    j.call("call_1", "now", turn="t1")
    j.result("call_1", "12:00", turn="t1")

    p = j.project(reasoning_sent=OPENAI_REASONING)

    wire = to_openai_responses(p.messages, p.tool_spec)["input"]
    assert [i.get("type", i.get("role")) for i in wire] == [
        "user",
        "reasoning",
        "assistant",
        "reasoning",
        "function_call",
        "function_call_output",
    ]
    assert wire[1] == wire_item(item(1, "Look it up."))
    assert wire[2] == {"role": "assistant", "content": "Checking."}
    assert wire[3] == wire_item(item(2))
    assert wire[4]["call_id"] == "call_1" and wire[5] == {
        "type": "function_call_output",
        "call_id": "call_1",
        "output": "12:00",
    }
    assert request_tokens(p.messages, p.tool_spec, O200K) == p.meta.estimated_tokens


def test_other_providers_reasoning_is_never_sent() -> None:
    j = Journal()
    j.user("Hi")
    thought = {"type": "thinking", "thinking": "Hm.", "signature": "c2ln"}
    readable = {"type": "reasoning_text", "text": "Let me think."}
    j.add("message", {"role": "assistant", "content": [thought, readable, item(1), _text("Hi!")]})

    p = j.project(reasoning_sent=OPENAI_REASONING)

    assert p.messages[-1].content == (item(1), _text("Hi!"))


def test_the_new_reasoning_part_types_are_checked_at_the_door() -> None:
    assert content_problems("assistant", [item(1, "ok")]) == []
    assert content_problems("assistant", [{"type": "reasoning_text", "text": "why"}]) == []
    assert [p.rule for p in content_problems("user", [item(1)])] == [
        "reasoning_not_allowed_in_role"
    ]
    broken = [
        {**item(1), "encrypted_content": ""},
        {**item(1), "id": 5},
        {**item(1), "summary": [{"type": "text", "text": "x"}]},
        {"type": "reasoning_text", "text": ""},
    ]
    for part in broken:
        assert [p.rule for p in content_problems("assistant", [part])] == ["invalid_reasoning"]


@st.composite
def responses_journals(draw: st.DrawFn) -> tuple[Journal, list[PendingEntry]]:
    """Turns whose model turns reason (items with or without a summary, among text, sometimes
    beside other providers' reasoning after a model switch), call tools or answer."""
    j = Journal()
    n = 0
    for turn in range(draw(st.integers(1, 6))):
        j.user(draw(st.sampled_from(["hi", "what now?", "tell me more " * 30])) + f" #{turn}")
        for round_ in range(draw(st.integers(0, 3))):
            turn_id = f"t{turn}.{round_}"
            content: list[dict[str, Any]] = []
            for _ in range(draw(st.integers(0, 3))):
                n += 1
                kind = draw(st.sampled_from(["item", "summarized", "text", "thinking", "long"]))
                if kind == "text":
                    content.append(_text(f"saying #{n}"))
                elif kind == "thinking":
                    content.append({"type": "thinking", "thinking": f"t{n}", "signature": "c2ln"})
                elif kind == "long":
                    content.append({**item(n), "encrypted_content": "gAAA" * 400 + f"{n}"})
                else:
                    content.append(item(n, f"summary {n}" if kind == "summarized" else ""))
            if content:
                j.add("message", {"role": "assistant", "content": content}, call_id=turn_id)
            n += 1
            j.call(f"call_{n}", "search", turn=turn_id, q=n)
            if draw(st.integers(0, 4)):
                j.result(f"call_{n}", {"value": n}, turn=turn_id)
        if draw(st.booleans()):
            n += 1
            j.add("message", {"role": "assistant", "content": [item(n), _text("done")]})
    pending = (
        [PendingEntry("message", {"role": "user", "content": "the new ask"})]
        if draw(st.booleans())
        else []
    )
    return j, pending


@settings(max_examples=120)
@given(
    responses_journals(),
    st.builds(
        ContextPolicy,
        max_input_tokens=st.integers(1500, 30_000),
        reserve_output_tokens=st.integers(0, 1000),
        keep_last_turns=st.integers(0, 3),
        summarization=st.just("none"),
    ),
)
def test_reasoning_items_of_the_open_loop_are_never_dropped_or_reordered(
    generated: tuple[Journal, list[PendingEntry]], policy: ContextPolicy
) -> None:
    j, pending = generated
    try:
        p = j.project(policy=policy, pending=pending, reasoning_sent=OPENAI_REASONING)
    except ContextOverflow:
        return
    wire = to_openai_responses(p.messages, p.tool_spec)["input"]
    sent = [i for i in wire if i.get("type") == "reasoning"]
    # The oracle, from the journal: the open loop is everything from the last user message on,
    # and the tool turns just before it (a loop that message continues, left without an
    # answer); its assistant turns' reasoning items, in journal order, are what must go back.
    thread = [(e.kind, e.payload, e.refs) for e in j.entries]
    thread += [(e.kind, e.payload, {}) for e in pending]
    newest = max(at for at, (k, said, _) in enumerate(thread) if said.get("role") == "user")
    start = newest
    while start and _in_tool_turn(thread[start - 1]):
        start -= 1
    required = _items(thread[newest:])
    expected = _items(thread[start:])
    if not p.meta.truncated:
        assert sent == expected  # nothing dropped, nothing reordered, byte for byte
    else:  # the budget may leave the loop's older turns out, each whole
        assert sent == [x for x in expected if x in sent]
        assert sent[len(sent) - len(required) :] == required
    # Nothing of older turns, nor any other provider's reasoning.
    assert not any(
        is_reasoning(x) and x["type"] != "reasoning"
        for m in p.messages
        if not isinstance(m.content, str)
        for x in m.content
    )
    # Counted as sent, and deterministic.
    assert request_tokens(p.messages, p.tool_spec, O200K) == p.meta.estimated_tokens
    assert j.project(policy=policy, pending=pending, reasoning_sent=OPENAI_REASONING) == p


def _in_tool_turn(entry: tuple[str, dict[str, Any], dict[str, Any]]) -> bool:
    kind, said, refs = entry
    if kind in ("tool_call", "tool_result"):
        return True
    return said.get("role") == "assistant" and "call_id" in refs


def _items(entries: list[tuple[str, dict[str, Any], dict[str, Any]]]) -> list[dict[str, Any]]:
    return [
        wire_item(x)
        for kind, said, _ in entries
        if kind == "message"
        and said.get("role") == "assistant"
        and not isinstance(said["content"], str)
        for x in said["content"]
        if x["type"] == "reasoning"
    ]


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}
