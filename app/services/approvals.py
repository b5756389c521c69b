"""Tool approval use cases: read a run's approvals, answer them (approve, approve with edited
arguments, reject), and expire the unanswered ones. Each owns its transaction; the run resumes
(app/services/run_transitions.resume) once every call it waits on is ruled on."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jsonschema_rs
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.core.runs import Run, RunStatus
from app.db import approvals as approvals_db
from app.db import runs as runs_db
from app.db import sessions as sessions_db
from app.db.approvals import Approval
from app.eventlog import writer
from app.eventlog.registry import Event, EventType
from app.services import run_transitions
from app.services.errors import Conflict, Invalid
from app.services.projection import offered_tools
from app.services.runs import run_not_found


@dataclass(frozen=True)
class Answer:
    """A person's ruling on one call: approve (with `arguments`: run with these instead), or
    reject (with a `reason` the model reads)."""

    tool_call_id: str
    approve: bool
    arguments: dict[str, Any] | None = None
    reason: str | None = None


@dataclass(frozen=True)
class RunApprovals:
    run: Run
    approvals: list[Approval]


async def run_approvals(engine: AsyncEngine, tenant_id: str, run_id: str) -> RunApprovals:
    async with engine.connect() as conn:
        run = await runs_db.get_run(conn, run_id, tenant_id=tenant_id)
        if run is None:
            raise run_not_found(run_id)
        return RunApprovals(run, await approvals_db.of_run(conn, run_id))


async def answer(
    engine: AsyncEngine, tenant_id: str, run_id: str, answers: Sequence[Answer]
) -> RunApprovals:
    """Rule on some or all of the calls the run waits on; the rulings are kept, and once no
    call waits the run resumes. Under the run's row lock: two posts at once (on any API
    process) are taken one after the other, and a call is ruled on once."""
    async with engine.begin() as conn:
        run = await runs_db.get_run(conn, run_id, tenant_id=tenant_id, lock=True)
        if run is None:
            raise run_not_found(run_id)
        if run.status is not RunStatus.AWAITING_APPROVAL:
            raise Conflict(
                "run_not_waiting",
                f"the run is {run.status.value}, not waiting for approvals",
                {"status": run.status.value},
            )
        known = {a.tool_call_id: a for a in await approvals_db.of_run(conn, run_id)}
        waiting = {i for i, a in known.items() if a.decision is None}
        given = [a.tool_call_id for a in answers]
        unknown = sorted(set(given) - set(known))
        duplicated = sorted({i for i in given if given.count(i) > 1})
        if unknown or duplicated:
            raise Invalid(
                "invalid_approvals",
                "answer each call the run waits on at most once",
                {"unknown": unknown, "duplicated": duplicated, "waiting": sorted(waiting)},
            )
        answered = sorted(set(given) - waiting)
        if answered:
            raise Conflict(
                "approval_already_answered",
                "these calls were ruled on already: " + ", ".join(answered),
                {"answered": answered, "waiting": sorted(waiting)},
            )
        await _check_edits(conn, run, known, answers)
        events: list[Event] = []
        for given_answer in answers:
            decided = await approvals_db.decide(
                conn,
                run_id,
                given_answer.tool_call_id,
                "approved" if given_answer.approve else "rejected",
                edited_arguments=given_answer.arguments if given_answer.approve else None,
                reason=None if given_answer.approve else given_answer.reason,
            )
            assert decided is not None  # it waited, and the run's lock is held
            events.append(answered_event(decided))
        if waiting - set(given):
            await writer.append(conn, run_id, events)
        else:
            run = await run_transitions.resume(conn, run, (), events)
        return RunApprovals(run, await approvals_db.of_run(conn, run_id))


async def _check_edits(
    conn: AsyncConnection, run: Run, known: Mapping[str, Approval], answers: Sequence[Answer]
) -> None:
    """Edited arguments must satisfy the tool's JSON schema (422 invalid_arguments if not)."""
    edits = [a for a in answers if a.approve and a.arguments is not None]
    if not edits:
        return
    session = await sessions_db.get_session(
        conn, run.tenant_id, run.session_id, include_expired=True
    )
    config = session.config if session is not None else None
    tools = {t["name"]: t for t in offered_tools(config, run.params.tools)} if config else {}
    for edit in edits:
        name = known[edit.tool_call_id].name
        schema = (tools.get(name) or {}).get("parameters") or {"type": "object"}
        errors = [
            {"path": "/".join(str(p) for p in e.instance_path), "message": e.message}
            for e in jsonschema_rs.validator_for(schema).iter_errors(edit.arguments)
        ]
        if errors:
            raise Invalid(
                "invalid_arguments",
                f"the edited arguments of {edit.tool_call_id} do not match the schema of {name}",
                {"tool_call_id": edit.tool_call_id, "tool": name, "errors": errors[:20]},
            )


def answered_event(approval: Approval) -> Event:
    data: dict[str, Any] = {
        "tool_call_id": approval.tool_call_id,
        "name": approval.name,
        "decision": approval.decision,
    }
    if approval.edited_arguments is not None:
        data["arguments"] = approval.edited_arguments
    if approval.reason:
        data["reason"] = approval.reason
    return EventType.TOOL_APPROVAL_ANSWERED, data


async def expire_approvals(engine: AsyncEngine) -> int:
    """Runs whose approvals were not all answered in time: the unanswered ones count as
    rejected (the model reads that nobody approved them), and the run resumes."""
    expired = 0
    async with engine.begin() as conn:
        for run in await runs_db.expired_approvals(conn):
            events: list[Event] = []
            for approval in await approvals_db.of_run(conn, run.id):
                if approval.decision is not None:
                    continue
                call_id = approval.tool_call_id
                decided = await approvals_db.decide(conn, run.id, call_id, "expired")
                if decided is not None:
                    events.append(answered_event(decided))
            await run_transitions.resume(conn, run, (), events)
            expired += 1
    return expired
