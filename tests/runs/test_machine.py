"""The run's state machine: every transition from every status, legal or not, and the events
each one emits."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest

from app.core.runs import ACTIVE, ENDED, Outcome, Run, RunKind, RunParams, RunStatus
from app.core.usage import UsageReport
from app.runs import machine
from app.runs.machine import IllegalTransition, Transition

EXPECTED = {  # (transition, from) -> to: written out by hand, so a changed RULES is noticed
    (Transition.START, RunStatus.QUEUED): RunStatus.RUNNING,
    (Transition.RETRY, RunStatus.RUNNING): RunStatus.RUNNING,
    (Transition.AWAIT_TOOL_OUTPUTS, RunStatus.RUNNING): RunStatus.REQUIRES_ACTION,
    (Transition.RESUME, RunStatus.REQUIRES_ACTION): RunStatus.QUEUED,
    (Transition.AWAIT_APPROVAL, RunStatus.RUNNING): RunStatus.AWAITING_APPROVAL,
    (Transition.RESUME, RunStatus.AWAITING_APPROVAL): RunStatus.QUEUED,
    (Transition.FAIL, RunStatus.AWAITING_APPROVAL): RunStatus.FAILED,
    (Transition.CANCEL, RunStatus.AWAITING_APPROVAL): RunStatus.CANCELLED,
    (Transition.COMPLETE, RunStatus.RUNNING): RunStatus.COMPLETED,
    (Transition.FAIL, RunStatus.RUNNING): RunStatus.FAILED,
    (Transition.FAIL, RunStatus.REQUIRES_ACTION): RunStatus.FAILED,
    (Transition.CANCEL, RunStatus.QUEUED): RunStatus.CANCELLED,
    (Transition.CANCEL, RunStatus.RUNNING): RunStatus.CANCELLED,
    (Transition.CANCEL, RunStatus.REQUIRES_ACTION): RunStatus.CANCELLED,
}


def a_run(status: RunStatus, **changes: object) -> Run:
    run = Run(
        id="r1",
        tenant_id="t1",
        session_id="s1",
        status=status,
        kind=RunKind.ASK,
        model="openai:gpt-4o-mini",
        params=RunParams(),
        attempts=1,
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
        user_entry_seq=3,
    )
    return dataclasses.replace(run, **changes)  # type: ignore[arg-type]


@pytest.mark.parametrize("status", list(RunStatus))
@pytest.mark.parametrize("transition", list(Transition))
def test_every_transition_from_every_status(transition: Transition, status: RunStatus) -> None:
    run = a_run(status)
    expected = EXPECTED.get((transition, status))
    if expected is None:
        with pytest.raises(IllegalTransition) as raised:
            machine.target(run, transition)
        assert raised.value.status is status and raised.value.transition is transition
    else:
        assert machine.target(run, transition) is expected


def test_ended_runs_allow_nothing_and_no_status_is_unreachable() -> None:
    for status in ENDED:
        assert not [t for t in Transition if (t, status) in EXPECTED]
    reached = {RunStatus.QUEUED} | set(EXPECTED.values())  # a run is created queued
    assert reached == set(RunStatus)
    assert set(RunStatus) == ACTIVE | ENDED and not ACTIVE & ENDED


def test_start_from_the_queue_emits_run_started_with_the_next_attempt() -> None:
    step = machine.start(a_run(RunStatus.QUEUED, attempts=0))
    assert step.status is RunStatus.RUNNING
    assert step.events == [("run.started", {"attempt": 1})]


def test_a_retry_voids_what_clients_saw_of_the_dead_attempt() -> None:
    step = machine.start(a_run(RunStatus.RUNNING, attempts=2))
    assert step.status is RunStatus.RUNNING
    assert step.events == [
        ("message.reset", {"reason": "retry", "attempt": 3}),
        ("run.started", {"attempt": 3}),
    ]


@pytest.mark.parametrize("status", sorted(ENDED | {RunStatus.REQUIRES_ACTION}))
def test_start_is_refused_unless_queued_or_running(status: RunStatus) -> None:
    with pytest.raises(IllegalTransition):
        machine.start(a_run(status))


def test_waiting_for_tool_outputs_lists_the_calls_and_the_deadline() -> None:
    calls = [{"tool_call_id": "call_3_1_0", "name": "lookup", "arguments": {"q": "x"}}]
    step = machine.await_tool_outputs(a_run(RunStatus.RUNNING), calls, "2026-01-01T00:10:00")
    assert step.status is RunStatus.REQUIRES_ACTION
    assert step.events == [
        ("run.requires_action", {"tool_calls": calls, "expires_at": "2026-01-01T00:10:00"})
    ]
    with pytest.raises(IllegalTransition):
        machine.await_tool_outputs(a_run(RunStatus.QUEUED), calls, "x")


def test_waiting_for_approval_requests_each_call_then_announces_the_wait() -> None:
    calls = [
        {"tool_call_id": "call_3_1_0", "name": "send", "arguments": {"to": "a"}},
        {"tool_call_id": "call_3_1_1", "name": "send", "arguments": {"to": "b"}},
    ]
    step = machine.await_approval(a_run(RunStatus.RUNNING), calls, "2026-01-01T01:00:00")
    assert step.status is RunStatus.AWAITING_APPROVAL
    assert step.events == [
        ("tool.approval_requested", {**calls[0], "expires_at": "2026-01-01T01:00:00"}),
        ("tool.approval_requested", {**calls[1], "expires_at": "2026-01-01T01:00:00"}),
        (
            "run.awaiting_approval",
            {"tool_call_ids": ["call_3_1_0", "call_3_1_1"], "expires_at": "2026-01-01T01:00:00"},
        ),
    ]
    with pytest.raises(IllegalTransition):
        machine.await_approval(a_run(RunStatus.REQUIRES_ACTION), calls, "x")


def test_answered_approvals_queue_the_run_again() -> None:
    ruling = ("tool.approval_answered", {"tool_call_id": "c", "name": "n", "decision": "rejected"})
    step = machine.resume(a_run(RunStatus.AWAITING_APPROVAL), [], [ruling])  # type: ignore[list-item]
    assert step.status is RunStatus.QUEUED and step.events == [ruling]


def test_resume_queues_again_and_announces_the_outputs() -> None:
    entry = {"seq": 7, "kind": "tool_result", "id": "run:r1:result:call_3_1_0"}
    step = machine.resume(a_run(RunStatus.REQUIRES_ACTION), [entry])
    assert step.status is RunStatus.QUEUED
    assert step.events == [("entry.committed", entry)]
    with pytest.raises(IllegalTransition):
        machine.resume(a_run(RunStatus.RUNNING), [entry])


def test_completion_emits_entries_usage_then_one_terminal_event() -> None:
    entries = [{"seq": 5, "kind": "message", "id": "a"}, {"seq": 6, "kind": "run_end", "id": "b"}]
    usage = {"input_tokens": 3, "output_tokens": 2, "cached_tokens": 0, "estimated": False}
    outcome = Outcome("completed", "hi", UsageReport(3, 2), model="openai:m2", finish_reason="stop")
    step = machine.end(a_run(RunStatus.RUNNING), outcome, entries, usage, 0.5)
    assert step.status is RunStatus.COMPLETED
    assert [kind for kind, _ in step.events] == [
        "entry.committed",
        "entry.committed",
        "usage",
        "run.completed",
    ]
    assert step.events[2][1] == {**usage, "cost_usd": 0.5}
    assert step.events[-1][1] == {
        "run_id": "r1",
        "status": "completed",
        "model": "openai:m2",
        "text": "hi",
        "usage": usage,
        "finish_reason": "stop",
    }


def test_failure_and_cancel_carry_the_partial_text_error_and_reason() -> None:
    error = {"code": "provider_error", "message": "boom"}
    failed = machine.end(
        a_run(RunStatus.RUNNING), Outcome("failed", "par", error=error), [], None, None
    )
    assert failed.status is RunStatus.FAILED
    assert failed.events == [
        (
            "run.failed",
            {
                "run_id": "r1",
                "status": "failed",
                "model": "openai:gpt-4o-mini",
                "partial_text": "par",
                "error": error,
            },
        )
    ]
    cancelled = machine.end(
        a_run(RunStatus.QUEUED, cancel_mode="interrupt"), Outcome("cancelled"), [], None, None
    )
    assert cancelled.events[-1] == (
        "run.cancelled",
        {
            "run_id": "r1",
            "status": "cancelled",
            "model": "openai:gpt-4o-mini",
            "partial_text": "",
            "reason": "interrupt",
        },
    )


@pytest.mark.parametrize(
    ("status", "ending"),
    [
        (RunStatus.QUEUED, "completed"),
        (RunStatus.QUEUED, "failed"),
        (RunStatus.REQUIRES_ACTION, "completed"),
        *[(s, e) for s in sorted(ENDED) for e in ("completed", "failed", "cancelled")],
    ],
)
def test_ending_is_refused_from_a_status_that_cannot_end_that_way(
    status: RunStatus, ending: str
) -> None:
    outcome = Outcome(ending, error={"code": "x", "message": "y"})  # type: ignore[arg-type]
    with pytest.raises(IllegalTransition):
        machine.end(a_run(status), outcome, [], None, None)


def test_an_answer_finishing_as_a_cancel_lands_is_cancelled() -> None:
    outcome = Outcome("completed", "all of it", model="openai:m")
    assert machine.settled(a_run(RunStatus.RUNNING), outcome) is outcome
    settled = machine.settled(a_run(RunStatus.RUNNING, cancel_mode="cancel"), outcome)
    assert (settled.status, settled.text, settled.model) == ("cancelled", "all of it", "openai:m")


def test_the_transition_table_lists_every_rule() -> None:
    table = machine.transition_table().splitlines()
    assert table[0].split(" | ")[1:-1] == [s.value for s in RunStatus][:-1]
    for transition in Transition:
        row = next(r for r in table if r.startswith(f"| {transition.value} |"))
        cells = [c.strip() for c in row.strip("|").split("|")][1:]
        for status, cell in zip(RunStatus, cells, strict=True):
            to = EXPECTED.get((transition, status))
            assert cell == (f"→ {to.value}" if to else "")
