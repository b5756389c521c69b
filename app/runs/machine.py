"""The run's state machine: which transitions each status allows, and the events each emits.

Pure: every function takes the run as it is and answers the status it moves to and the events
clients are sent for it; app/services/run_transitions.py applies them to the database. An illegal
transition raises `IllegalTransition`, whoever asks for it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from app.core.runs import Outcome, Run, RunKind, RunStatus
from app.eventlog.registry import TERMINAL_BY_STATUS, Event, EventType


class Transition(StrEnum):
    START = "start"  # a worker takes the queued job
    RETRY = "retry"  # the attempt's worker died; another one starts over from the journal
    AWAIT_TOOL_OUTPUTS = "await_tool_outputs"  # the model called client-side tools
    AWAIT_APPROVAL = "await_approval"  # the model called tools that need a person's approval
    RESUME = "resume"  # the outputs came, or every approval was answered: the run queues again
    COMPLETE = "complete"  # the final answer (or summary) is committed
    FAIL = "fail"  # an error, a broken limit, or outputs that never came
    CANCEL = "cancel"  # a cancel, an interrupting ask or a rollback


_Q, _R, _A = RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.REQUIRES_ACTION
_W = RunStatus.AWAITING_APPROVAL
# transition -> (the statuses it may start from, the status it leads to)
RULES: Mapping[Transition, tuple[frozenset[RunStatus], RunStatus]] = {
    Transition.START: (frozenset({_Q}), _R),
    Transition.RETRY: (frozenset({_R}), _R),
    Transition.AWAIT_TOOL_OUTPUTS: (frozenset({_R}), _A),
    Transition.AWAIT_APPROVAL: (frozenset({_R}), _W),
    Transition.RESUME: (frozenset({_A, _W}), _Q),
    Transition.COMPLETE: (frozenset({_R}), RunStatus.COMPLETED),
    Transition.FAIL: (frozenset({_R, _A, _W}), RunStatus.FAILED),
    Transition.CANCEL: (frozenset({_Q, _R, _A, _W}), RunStatus.CANCELLED),
}
ENDINGS = {
    "completed": Transition.COMPLETE,
    "failed": Transition.FAIL,
    "cancelled": Transition.CANCEL,
}


class IllegalTransition(Exception):
    def __init__(self, run: Run, transition: Transition) -> None:
        super().__init__(f"run {run.id} is {run.status}: it cannot {transition}")
        self.status, self.transition = run.status, transition


def target(run: Run, transition: Transition) -> RunStatus:
    """The status `transition` leads `run` to; IllegalTransition if its status forbids it."""
    sources, to = RULES[transition]
    if run.status not in sources:
        raise IllegalTransition(run, transition)
    return to


@dataclass(frozen=True)
class Step:
    status: RunStatus
    events: list[Event]


def created(run: Run) -> list[Event]:
    """What announces a new run (queued)."""
    return [created_event(run.id, run.session_id, run.kind, run.user_entry_seq, run.model)]


def created_event(
    run_id: str, session_id: str, kind: RunKind, user_entry_seq: int | None, model: str
) -> Event:
    """`run.created`, from what a run is created with (before its row exists)."""
    return (
        EventType.RUN_CREATED,
        {
            "run_id": run_id,
            "session_id": session_id,
            "kind": kind.value,
            "user_entry_seq": user_entry_seq,
            "model": model,
        },
    )


def start(run: Run) -> Step:
    """A worker takes the run: from the queue, or after the worker of its attempt died (then
    what clients saw of that attempt is void: `message.reset`)."""
    transition = Transition.RETRY if run.status is RunStatus.RUNNING else Transition.START
    status, attempt = target(run, transition), run.attempts + 1
    events: list[Event] = []
    if transition is Transition.RETRY:
        events.append((EventType.MESSAGE_RESET, {"reason": "retry", "attempt": attempt}))
    events.append(_started(attempt))
    return Step(status, events)


def first_start() -> Step:
    """What `start` answers for a run never started (queued, attempts 0), known without the
    run's row: app/db/runs.start_first applies it in the statement that reads the row."""
    return Step(RULES[Transition.START][1], [_started(1)])


def _started(attempt: int) -> Event:
    return (EventType.RUN_STARTED, {"attempt": attempt})


def await_tool_outputs(run: Run, calls: Sequence[Mapping[str, Any]], expires_at: str) -> Step:
    status = target(run, Transition.AWAIT_TOOL_OUTPUTS)
    data = {"tool_calls": [dict(c) for c in calls], "expires_at": expires_at}
    return Step(status, [(EventType.RUN_REQUIRES_ACTION, data)])


def await_approval(run: Run, calls: Sequence[Mapping[str, Any]], expires_at: str) -> Step:
    """The run waits for a person's ruling on these calls: one request event per call, then
    the run's own (all requests are out)."""
    status = target(run, Transition.AWAIT_APPROVAL)
    events: list[Event] = [
        (EventType.TOOL_APPROVAL_REQUESTED, {**dict(c), "expires_at": expires_at}) for c in calls
    ]
    ids = [str(c["tool_call_id"]) for c in calls]
    waiting = {"tool_call_ids": ids, "expires_at": expires_at}
    events.append((EventType.RUN_AWAITING_APPROVAL, waiting))
    return Step(status, events)


def resume(run: Run, committed: Sequence[Any], events: Sequence[Event] = ()) -> Step:
    """The client's outputs are committed (or every approval answered: `events` announce the
    rulings); the run queues for a worker again."""
    return Step(target(run, Transition.RESUME), [*committed_events(committed), *events])


def settled(run: Run, outcome: Outcome) -> Outcome:
    """The outcome a run ends with: an answer that finished just as a cancel landed was still
    cancelled."""
    if run.cancel_mode and outcome.status == "completed":
        return Outcome(
            "cancelled",
            outcome.text,
            outcome.usage,
            model=outcome.model,
            context_from=outcome.context_from,
        )
    return outcome


def end(
    run: Run,
    outcome: Outcome,
    committed: Sequence[Any],
    usage: Mapping[str, Any] | None,
    cost_usd: float | None,
) -> Step:
    """The run ends: its closing entries, its usage, then exactly one terminal event."""
    status = target(run, ENDINGS[outcome.status])
    events = committed_events(committed)
    if usage is not None:
        events.append((EventType.USAGE, {**usage, "cost_usd": cost_usd}))
    terminal: dict[str, Any] = {
        "run_id": run.id,
        "status": status.value,
        "model": outcome.model or run.model,
    }
    if status is RunStatus.COMPLETED:
        terminal |= {
            "text": outcome.text,
            "usage": dict(usage) if usage is not None else None,
            "finish_reason": outcome.finish_reason,
        }
    else:
        terminal["partial_text"] = outcome.text
        if outcome.error:
            terminal["error"] = outcome.error
        if run.cancel_mode:
            terminal["reason"] = run.cancel_mode
    events.append((TERMINAL_BY_STATUS[status], terminal))
    return Step(status, events)


def committed_events(entries: Sequence[Any]) -> list[Event]:
    """`entry.committed` for each journal entry a run wrote (rows of the entries table)."""
    return [
        (EventType.ENTRY_COMMITTED, {"seq": int(e["seq"]), "kind": e["kind"], "id": e["id"]})
        for e in entries
    ]


def transition_table() -> str:
    """The machine as a markdown table (a row per transition, a column per status), for the docs."""
    statuses = list(RunStatus)
    head = "| transition | " + " | ".join(s.value for s in statuses) + " |"
    rule = "|---|" + "---|" * len(statuses)
    rows = []
    for transition, (sources, to) in RULES.items():
        cells = [f"→ {to.value}" if s in sources else "" for s in statuses]
        rows.append(f"| {transition.value} | " + " | ".join(cells) + " |")
    return "\n".join([head, rule, *rows])
