"""The tool loop's decisions, read from a run's journal entries."""

from __future__ import annotations

from app.core.entries import JournalEntry
from app.core.tool_loop import (
    CallModel,
    PendingCall,
    RunTools,
    StopRun,
    assemble_calls,
    next_step,
    thread_call_id,
)


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
    calls = assemble_calls(pieces, user_seq=7, iteration=2)
    assert [(c.tool_call_id, c.upstream_id, c.name, c.arguments) for c in calls] == [
        ("call_7_2_0", "call_x", "weather", {"city": "Oslo"}),
        ("call_7_2_1", "call_y", "time", {"tz": "UTC"}),
        ("call_7_2_2", "call_z", "broken", None),
    ]
    assert calls[2].raw_arguments == "{not json"
    assert assemble_calls([(0, "c", "noargs", "")], 1, 1)[0].arguments == {}


def test_call_ids_are_the_services_own_whatever_the_upstream_sends() -> None:
    """Some servers stream no ids, or one fixed id: the journaled ids differ by run (its user
    entry's seq), model turn and place in the turn, so no call ever looks answered by another."""
    streams: list[list[tuple[int, str | None, str | None, str]]] = [
        [(0, None, "f", "{}"), (1, None, "f", "{}")],
        [(0, "call_0", "f", "{}"), (1, "call_0", "f", "{}")],
    ]
    ids = [
        c.tool_call_id
        for user_seq in (1, 5)
        for iteration in (1, 2)
        for pieces in streams
        for c in assemble_calls(pieces, user_seq, iteration)
    ]
    assert len(ids) == 16 and len(set(ids)) == 8  # the same run and turn: the same names
    per_turn = [assemble_calls(streams[1], 3, 1), assemble_calls(streams[1], 3, 2)]
    flat = [c.tool_call_id for turn in per_turn for c in turn]
    assert len(set(flat)) == 4 and all(c.upstream_id == "call_0" for t in per_turn for c in t)
    assert thread_call_id(3, 1, 0) == flat[0]
    entries = [call(1, flat[0], 1), result(2, flat[0]), call(3, flat[2], 2)]
    assert isinstance(next_step(entries, 5), RunTools)
