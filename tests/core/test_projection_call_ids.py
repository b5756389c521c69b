"""The projector with tool-call ids repeated across a thread (imports, journals written before
the service named its calls): every call keeps its own result and goes out under a distinct id."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.formats import openai_request_tokens, to_anthropic, to_openai
from app.core.policy import ContextPolicy
from app.core.projection import INTERRUPTED_RESULT
from tests.core.format_oracles import validate_anthropic, validate_openai
from tests.core.test_projection import O200K, Journal, roles


def test_a_repeated_id_keeps_every_call_with_its_own_result() -> None:
    j = Journal()
    for turn in range(3):
        j.user(f"add {turn} and 1")
        j.call("call_1", "calc", turn=f"run{turn}:1", expression=f"{turn}+1")
        j.result("call_1", turn + 1, turn=f"run{turn}:1")
        j.assistant(f"it is {turn + 1}")
    p = j.project()
    assert roles(p) == ["user", "assistant", "tool", "assistant"] * 3
    calls = [m.tool_calls[0] for m in p.messages if m.tool_calls]
    assert [c.arguments for c in calls] == [{"expression": f"{t}+1"} for t in range(3)]
    ids = [c.id for c in calls]
    assert ids[0] == "call_1" and len(set(ids)) == 3  # the first keeps its id
    results = [(m.tool_call_id, m.content) for m in p.messages if m.role == "tool"]
    assert results == [(ids[0], "1"), (ids[1], "2"), (ids[2], "3")]
    wire = to_openai(p.messages, ())
    assert validate_openai(wire) == [] and validate_anthropic(to_anthropic(p.messages, ())) == []
    assert openai_request_tokens(wire, O200K) == p.meta.estimated_tokens


def test_a_repeated_id_without_a_result_is_interrupted_not_answered_by_a_later_one() -> None:
    j = Journal()
    j.user("first")
    j.call("fixed", "slow", turn="a:1")  # its run was cancelled: no result
    j.user("second")
    j.call("fixed", "slow", turn="b:1")
    j.result("fixed", "done", turn="b:1")
    p = j.project()
    tools = [m for m in p.messages if m.role == "tool"]
    assert [t.content for t in tools] == [INTERRUPTED_RESULT, "done"]
    assert tools[0].tool_call_id != tools[1].tool_call_id
    assert validate_openai(to_openai(p.messages, ())) == []


@settings(max_examples=100)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["x", "call_1", "call_1_2"]),  # few ids: they repeat
            st.integers(1, 3),  # calls in the turn
            st.sampled_from(["ok", "missing", "shuffled"]),
        ),
        min_size=1,
        max_size=12,
    ),
    st.integers(1500, 20_000),
)
def test_repeated_ids_always_project_valid_and_within_budget(
    turns: list[tuple[str, int, str]], budget: int
) -> None:
    j = Journal()
    for number, (call_id, count, fate) in enumerate(turns):
        j.user(f"question {number}")
        turn = f"run{number}:1"
        for _ in range(count):
            j.call(call_id, "calc", turn=turn, n=number)
        answers = [] if fate == "missing" else [f"answer {number}.{i}" for i in range(count)]
        for answer in reversed(answers) if fate == "shuffled" else answers:
            j.result(call_id, answer, turn=turn)
    policy = ContextPolicy(max_input_tokens=budget, reserve_output_tokens=0)
    p = j.project(policy=policy)
    wire = to_openai(p.messages, ())
    assert validate_openai(wire) == []
    assert validate_anthropic(to_anthropic(p.messages, ())) == []
    assert openai_request_tokens(wire, O200K) == p.meta.estimated_tokens <= policy.budget
    # No turn's call is answered by another turn's result.
    for at, message in enumerate(p.messages):
        for call in message.tool_calls:
            number = call.arguments["n"]
            reply = next(m for m in p.messages[at:] if m.tool_call_id == call.id)
            assert reply.content == INTERRUPTED_RESULT or str(reply.content).startswith(
                f"answer {number}."
            )
