"""Tool results journaled before their calls (an imported journal written out of order) are
placed right after their calls, as the README says: a recorded result is never replaced by the
interrupted placeholder (OpenAI) or an is_error result (Anthropic)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.formats import to_anthropic, to_openai
from app.core.projection import INTERRUPTED_RESULT
from tests.core.format_oracles import validate_anthropic, validate_openai
from tests.core.test_projection import Journal, roles


def test_a_result_written_before_its_call_is_paired_with_it() -> None:
    j = Journal()
    j.user("What is 6 x 7?")
    j.result("call_1", "42")
    j.call("call_1", "calc", expression="6*7")
    j.assistant("42.")
    p = j.project()
    assert roles(p) == ["user", "assistant", "tool", "assistant"]
    (tool,) = [m for m in p.messages if m.role == "tool"]
    assert (tool.content, tool.is_error) == ("42", False)
    blocks = to_anthropic(p.messages, ())["messages"][2]["content"]
    assert blocks == [{"type": "tool_result", "tool_use_id": "call_1", "content": "42"}]


def test_an_early_result_answers_its_own_turn_not_an_older_unanswered_call() -> None:
    j = Journal()
    j.user("first")
    j.call("fixed", "slow", turn="a:1")  # cancelled: never answered
    j.user("second")
    j.result("fixed", "done", turn="b:1")  # imported before its call
    j.call("fixed", "slow", turn="b:1")
    tools = [m for m in j.project().messages if m.role == "tool"]
    assert [t.content for t in tools] == [INTERRUPTED_RESULT, "done"]


@st.composite
def out_of_order_journals(draw: st.DrawFn) -> tuple[Journal, dict[str, str]]:
    """Runs of 1-3 tool turns whose results are written anywhere in their run: before the
    calls, after them, in any order; with or without their turn's ref. Returns the journal
    and each call's recorded result."""
    j = Journal()
    recorded: dict[str, str] = {}
    for run in range(draw(st.integers(1, 4))):
        j.user(f"question {run}")
        for turn_number in range(draw(st.integers(1, 3))):
            turn = f"run{run}:{turn_number}"
            ids = [f"call_{run}_{turn_number}_{n}" for n in range(draw(st.integers(1, 3)))]
            early = draw(st.lists(st.sampled_from(ids), unique=True))
            late = draw(st.permutations([i for i in ids if i not in early]))
            with_turn = draw(st.booleans())

            def result(call_id: str, turn: str = turn, with_turn: bool = with_turn) -> None:
                recorded[call_id] = f"result of {call_id}"
                refs: dict[str, Any] = {"tool_call_id": call_id}
                if with_turn:
                    refs["call_id"] = turn
                j.add("tool_result", {"content": recorded[call_id]}, **refs)

            for call_id in early:
                result(call_id)
            for call_id in ids:
                j.call(call_id, "calc", turn=turn, id=call_id)
            for call_id in late:
                result(call_id)
        if draw(st.booleans()):
            j.assistant(f"answer {run}")
    return j, recorded


@settings(max_examples=200)
@given(out_of_order_journals())
def test_a_recorded_result_is_never_replaced(generated: tuple[Journal, dict[str, str]]) -> None:
    j, recorded = generated
    p = j.project()
    sent = {m.tool_call_id: m for m in p.messages if m.role == "tool"}
    assert {k: (m.content, m.is_error) for k, m in sent.items()} == {
        k: (v, False) for k, v in recorded.items()
    }
    # Each result right after its call's assistant message, on both providers' wires.
    for at, message in enumerate(p.messages):
        for offset, call in enumerate(message.tool_calls, start=1):
            assert p.messages[at + offset].tool_call_id == call.id
    assert validate_openai(to_openai(p.messages, ())) == []
    assert validate_anthropic(to_anthropic(p.messages, ())) == []
