"""A run's use cases: read it, find a session's active one, cancel it, give it its client
tools' outputs, and fail the runs whose outputs never came. Each owns its transaction; the
transitions they apply are app/services/run_transitions.py's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from app.core.entries import EntryKind, NewEntry
from app.core.runs import Outcome, Run, RunStatus, entry_id
from app.core.tool_loop import RunTools, next_step
from app.db import journal as journal_db
from app.db import runs as runs_db
from app.db import sessions as sessions_db
from app.db.engine import autocommit
from app.services import run_transitions
from app.services.errors import Conflict, Invalid, NotFound, session_not_found
from app.services.journal import append_in


def run_not_found(run_id: str) -> NotFound:
    return NotFound("run_not_found", f"no run {run_id}", {"run_id": run_id})


async def get_run(engine: AsyncEngine, tenant_id: str, run_id: str) -> Run:
    async with autocommit(engine) as conn:  # one statement: no BEGIN and ROLLBACK around it
        run = await runs_db.get_run(conn, run_id, tenant_id=tenant_id)
    if run is None:
        raise run_not_found(run_id)
    return run


async def active_run(engine: AsyncEngine, tenant_id: str, session_id: str) -> Run | None:
    """The run a client reattaching to the session should follow (the oldest unfinished)."""
    async with engine.connect() as conn:
        session = await sessions_db.get_session(conn, tenant_id, session_id)
        if session is None:
            raise session_not_found(session_id)
        active = await runs_db.active_runs(conn, session_id, tenant_id=tenant_id)
    return active[0] if active else None


async def cancel_run(engine: AsyncEngine, tenant_id: str, run_id: str) -> Run:
    """Stop a run. A queued one ends here; a running one is asked to stop, and its worker
    commits the partial answer marked incomplete. Cancelling an ended run changes nothing."""
    async with engine.begin() as conn:
        run = await runs_db.get_run(conn, run_id, tenant_id=tenant_id, lock=True)
        if run is None:
            raise run_not_found(run_id)
        if not run.active:
            return run
        return await run_transitions.request_cancel(conn, run, "cancel")


@dataclass(frozen=True)
class ToolOutput:
    tool_call_id: str
    output: Any
    is_error: bool = False


async def submit_tool_outputs(
    engine: AsyncEngine, tenant_id: str, run_id: str, outputs: list[ToolOutput]
) -> Run:
    """Results of client-side tools: one for every call the run waits on, then it resumes."""
    async with engine.begin() as conn:
        run = await runs_db.get_run(conn, run_id, tenant_id=tenant_id, lock=True)
        if run is None:
            raise run_not_found(run_id)
        if run.status is not RunStatus.REQUIRES_ACTION:
            raise Conflict(
                "run_not_waiting",
                f"the run is {run.status.value}, not waiting for tool outputs",
                {"status": run.status.value},
            )
        session_id = run.session_id
        done = await journal_db.run_entries(
            conn, session_id, run.input_seq, run_id, tenant_id=tenant_id
        )
        step = next_step(done, max_iterations=10**9)
        waiting = {c.tool_call_id: c for c in step.calls} if isinstance(step, RunTools) else {}
        given = [o.tool_call_id for o in outputs]
        problems = {
            "missing": sorted(set(waiting) - set(given)),
            "unknown": sorted(set(given) - set(waiting)),
            "duplicated": sorted({i for i in given if given.count(i) > 1}),
        }
        if any(problems.values()):
            raise Invalid(
                "invalid_tool_outputs",
                "send exactly one output for every call the run waits on",
                {**problems, "waiting": sorted(waiting)},
            )
        entries = [
            NewEntry(
                EntryKind.TOOL_RESULT,
                {"name": waiting[o.tool_call_id].name, "content": o.output, "is_error": o.is_error},
                {
                    "run_id": run_id,
                    "call_id": f"{run_id}:{waiting[o.tool_call_id].iteration}",
                    "tool_call_id": o.tool_call_id,
                    "iteration": waiting[o.tool_call_id].iteration,
                },
                entry_id(run_id, f"result:{o.tool_call_id}"),
            )
            for o in outputs
        ]
        appended = await append_in(conn, tenant_id, session_id, entries)
        return await run_transitions.resume(conn, run, appended.entries)


async def expire_waiting_runs(engine: AsyncEngine) -> int:
    """Fail runs whose client never sent the tool outputs in time."""
    expired = 0
    async with engine.begin() as conn:
        for run in await runs_db.expired_actions(conn):
            error = {"code": "tool_outputs_timeout", "message": "no tool outputs arrived in time"}
            await run_transitions.finish(conn, run, Outcome("failed", error=error))
            expired += 1
    return expired
