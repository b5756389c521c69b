"""The tool loop's decisions (pure): what a run does next, read from its own journal entries.

A run never trusts memory: after a crash, the same entries give the same next step. Calls with a
committed result are never executed again; calls without one are; a model turn whose answer was
not committed is asked again.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from app.core.entries import EntryKind, JournalEntry


@dataclass(frozen=True, slots=True)
class PendingCall:
    tool_call_id: str
    name: str
    arguments: dict[str, Any]
    iteration: int


@dataclass(frozen=True, slots=True)
class CallModel:
    iteration: int  # 1 for the first model turn of the run


@dataclass(frozen=True, slots=True)
class RunTools:
    calls: tuple[PendingCall, ...]


@dataclass(frozen=True, slots=True)
class StopRun:
    rule: str
    message: str


Step = CallModel | RunTools | StopRun


def next_step(run_entries: Sequence[JournalEntry], max_iterations: int) -> Step:
    """The next step of a run, given its entries so far (seq order)."""
    answered = {
        str(e.refs.get("tool_call_id")) for e in run_entries if e.kind == EntryKind.TOOL_RESULT
    }
    calls = [e for e in run_entries if e.kind == EntryKind.TOOL_CALL]
    missing = tuple(
        PendingCall(
            str(c.refs["tool_call_id"]),
            str(c.payload["name"]),
            dict(c.payload["arguments"]),
            int(c.refs.get("iteration", 1)),
        )
        for c in calls
        if str(c.refs.get("tool_call_id")) not in answered
    )
    if missing:
        return RunTools(missing)
    done = max((int(c.refs.get("iteration", 1)) for c in calls), default=0)
    if done >= max_iterations:
        return StopRun(
            "max_iterations",
            f"the run reached its limit of {max_iterations} model turns with tool calls",
        )
    return CallModel(done + 1)


@dataclass(frozen=True, slots=True)
class AssembledCall:
    tool_call_id: str  # the id it is journaled under: unique in the session's thread
    upstream_id: str | None  # the id the model gave it, if any (for tracing only)
    name: str
    arguments: dict[str, Any] | None  # None: the model wrote arguments that are not a JSON object
    raw_arguments: str


def thread_call_id(user_seq: int, iteration: int, position: int) -> str:
    """The id a run's call is journaled under: call_<seq of the run's user entry>_<model
    turn>_<position in it>.

    Upstreams repeat ids across turns (some send one fixed id, or none), and the loop and the
    projection tell calls apart by id, so the service names every call itself. A user entry's
    seq is unique in the thread, forks included: a fork's own entries start after `fork_seq`.
    """
    return f"call_{user_seq}_{iteration}_{position}"


def assemble_calls(
    pieces: Sequence[tuple[int, str | None, str | None, str]], user_seq: int, iteration: int
) -> list[AssembledCall]:
    """Streamed tool-call pieces (index, id, name, arguments fragment) into whole calls, in
    the order the model began them, each named by thread_call_id."""
    order: list[int] = []
    ids: dict[int, str] = {}
    names: dict[int, str] = {}
    arguments: dict[int, list[str]] = {}
    for index, call_id, name, fragment in pieces:
        if index not in arguments:
            order.append(index)
            arguments[index] = []
        if call_id:
            ids[index] = call_id
        if name:
            names[index] = name
        arguments[index].append(fragment)
    calls = []
    for position, index in enumerate(order):
        raw = "".join(arguments[index]).strip() or "{}"
        try:
            parsed = json.loads(raw)
        except ValueError:
            parsed = None
        calls.append(
            AssembledCall(
                thread_call_id(user_seq, iteration, position),
                ids.get(index),
                names.get(index, ""),
                parsed if isinstance(parsed, dict) else None,
                raw,
            )
        )
    return calls
