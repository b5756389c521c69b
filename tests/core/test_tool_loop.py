"""The tool loop's decisions, read from a run's journal entries."""

from __future__ import annotations

from app.core.projection import JournalEntry
from app.core.tool_loop import CallModel, PendingCall, RunTools, StopRun, assemble_calls, next_step


def call(seq: int, tool_call_id: str, iteration: int = 1) -> JournalEntry:
    refs = {
        "run_id": "r",
        "tool_call_id": tool_call_id,
        "iteration": iteration,
        "call_id": f"r:{iteration}",
    }
    return JournalEntry(seq, "tool_call", {"name": "weather", "arguments": {"city": "Oslo"}}, refs)


def result(seq: int, tool_call_id: str) -> JournalEntry:
    return JournalEntry(
        seq, "tool_result", {"content": "3 C"}, {"run_id": "r", "tool_call_id": tool_call_id}
    )


def test_a_fresh_run_calls_the_model() -> None:
    assert next_step([], max_iterations=5) == CallModel(1)


def test_calls_without_results_run_and_answered_ones_never_again() -> None:
    entries = [call(1, "a"), call(2, "b"), result(3, "a")]
    assert next_step(entries, 5) == RunTools((PendingCall("b", "weather", {"city": "Oslo"}, 1),))
    entries.append(result(4, "b"))
    assert next_step(entries, 5) == CallModel(2)


def test_the_iteration_limit_stops_the_run() -> None:
    entries = [call(1, "a", 1), result(2, "a"), call(3, "b", 2), result(4, "b")]
    step = next_step(entries, max_iterations=2)
    assert isinstance(step, StopRun) and step.rule == "max_iterations"


def test_streamed_pieces_assemble_into_calls_in_order() -> None:
    pieces = [
        (1, "call_x", "weather", ""),
        (0, "call_y", "time", '{"tz":'),
        (1, None, None, '{"city": "Os'),
        (0, None, None, ' "UTC"}'),
        (1, None, None, 'lo"}'),
        (2, "call_z", "broken", "{not json"),
    ]
    calls = assemble_calls(pieces)
    assert [(c.tool_call_id, c.name, c.arguments) for c in calls] == [
        ("call_x", "weather", {"city": "Oslo"}),
        ("call_y", "time", {"tz": "UTC"}),
        ("call_z", "broken", None),
    ]
    assert calls[2].raw_arguments == "{not json"
    assert assemble_calls([(0, "c", "noargs", "")])[0].arguments == {}


def test_call_ids_are_unique_across_a_runs_turns() -> None:
    """Some servers stream no ids (or reuse them): a later call must not look answered."""
    first = assemble_calls([(0, None, "f", "{}")], iteration=1)
    second = assemble_calls(
        [(0, None, "f", "{}")], iteration=2, taken=frozenset({first[0].tool_call_id})
    )
    reused = assemble_calls([(0, "call_0", "f", "{}")], iteration=3, taken=frozenset({"call_0"}))
    ids = [first[0].tool_call_id, second[0].tool_call_id, reused[0].tool_call_id]
    assert len(set(ids)) == 3
    entries = [call(1, ids[0], 1), result(2, ids[0]), call(3, ids[1], 2)]
    assert isinstance(next_step(entries, 5), RunTools)
