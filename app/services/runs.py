"""Ending a run: its entries, its row, the session's totals and its last events, in one commit.

Used by the worker (completed, failed, cancelled mid-stream) and by the API (a run cancelled
before any worker took it). Entry ids derive from the run id, so finishing twice (a worker that
died after committing) writes nothing twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import RowMapping, func, update
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core.entries import RUN_ENTRY_PREFIX, EntryKind, FinishReason
from app.db import events as events_db
from app.db import jobs as jobs_db
from app.db import runs as runs_db
from app.db.tables import sessions
from app.llm.base import UsageReport
from app.llm.catalog import cost_usd
from app.services.journal import NewEntry, append_in

TERMINAL_EVENTS = {
    "completed": "run.completed",
    "failed": "run.failed",
    "cancelled": "run.cancelled",
}


@dataclass(frozen=True)
class Outcome:
    status: Literal["completed", "failed", "cancelled"]
    text: str = ""  # the assistant text received, whole or partial
    usage: UsageReport | None = None
    error: dict[str, str] | None = None  # {"code", "message"} for failed runs
    model: str | None = None  # the model that answered (a fallback, maybe)
    finish_reason: FinishReason | None = None  # why the model's last turn ended


def entry_id(run_id: str, part: str) -> str:
    return f"{RUN_ENTRY_PREFIX}{run_id}:{part}"


def event_rows(
    run_id: str, first_seq: int, events: list[tuple[str, dict[str, Any]]]
) -> list[dict[str, Any]]:
    return [
        {"run_id": run_id, "seq": first_seq + i, "type": kind, "data": data}
        for i, (kind, data) in enumerate(events)
    ]


async def queue_run(conn: AsyncConnection, **values: Any) -> RowMapping:
    """Insert a run (its id, tenant, session, kind, model, params…), announce it with
    `run.created` and defer its job, in the caller's transaction: the run and its job are
    committed together or not at all."""
    run = await runs_db.insert_run(conn, **values)
    run_id, session_id = str(run["id"]), str(run["session_id"])
    created = {
        "run_id": run_id,
        "session_id": session_id,
        "kind": run["kind"],
        "user_entry_seq": run["user_entry_seq"],
        "model": run["model"],
    }
    await events_db.insert_events(conn, event_rows(run_id, 1, [("run.created", created)]))
    job_id = await jobs_db.defer_run(conn, run_id, session_id, str(run["kind"]))
    run = await runs_db.update_run(conn, run_id, {"job_id": job_id})
    await conn.execute(
        update(sessions)
        .where(sessions.c.id == session_id)
        .values(status="active", updated_at=func.now())
    )
    await events_db.notify(conn, {run_id: 1})
    return run


async def finish_run(
    conn: AsyncConnection, run: RowMapping, outcome: Outcome, next_seq: int
) -> list[dict[str, Any]]:
    """Commit the end of `run` (locked by the caller, still active); returns the events written."""
    run_id, model = str(run["id"]), outcome.model or run["model"]
    partial = outcome.status != "completed"
    entries: list[NewEntry] = []
    # A compaction's text is its summary, committed as a summary entry: not an answer.
    answers = run["kind"] != "compaction"
    if answers and (outcome.text or outcome.status == "completed"):
        payload: dict[str, Any] = {"role": "assistant", "content": outcome.text}
        if partial:
            payload["status"] = "incomplete"
        if outcome.finish_reason is not None:
            payload["finish_reason"] = outcome.finish_reason
        entries.append(
            NewEntry(EntryKind.MESSAGE, payload, {"run_id": run_id}, entry_id(run_id, "answer"))
        )
    usage = outcome.usage
    cost = (
        cost_usd(model, usage.input_tokens, usage.output_tokens, usage.cached_tokens)
        if usage
        else None
    )
    if usage is not None:
        usage_payload: dict[str, Any] = {
            "input_tokens": usage.input_tokens,
            "output_tokens": usage.output_tokens,
            "cached_tokens": usage.cached_tokens,
            "model": model,
        }
        if usage.estimated:
            usage_payload["estimated"] = True
        if cost is not None:
            usage_payload["cost_usd"] = float(cost)
        entries.append(
            NewEntry(EntryKind.USAGE, usage_payload, {"run_id": run_id}, entry_id(run_id, "usage"))
        )
    end: dict[str, Any] = {"run_id": run_id, "status": outcome.status}
    if outcome.error:
        end["error"] = outcome.error
    entries.append(NewEntry(EntryKind.RUN_END, end, {"run_id": run_id}, entry_id(run_id, "end")))
    tenant_id, session_id = str(run["tenant_id"]), str(run["session_id"])
    appended = await append_in(conn, tenant_id, session_id, entries)
    committed = list(appended.entries)
    end_seq = int(committed[-1]["seq"])
    if run["cancel_mode"] == "rollback" and run["user_entry_seq"] is not None:
        rollback = NewEntry(
            EntryKind.ROLLBACK,
            {"from_seq": int(run["user_entry_seq"]), "to_seq": end_seq, "reason": "rollback"},
            {"run_id": run_id},
            entry_id(run_id, "rollback"),
        )
        committed += list((await append_in(conn, tenant_id, session_id, [rollback])).entries)

    await runs_db.update_run(
        conn,
        run_id,
        {
            "status": outcome.status,
            "result": outcome.text or None,
            "finish_reason": outcome.finish_reason,
            "error": outcome.error,
            "input_tokens": usage.input_tokens if usage else 0,
            "output_tokens": usage.output_tokens if usage else 0,
            "cached_tokens": usage.cached_tokens if usage else 0,
            "usage_estimated": usage.estimated if usage else False,
            "cost_usd": cost,
            "ended_at": func.now(),
            "end_entry_seq": end_seq,
        },
    )
    still_active = [
        r for r in await runs_db.active_runs(conn, session_id) if str(r["id"]) != run_id
    ]
    session_values: dict[str, Any] = {"updated_at": func.now()}
    if not still_active:
        session_values["status"] = "idle"
    if usage is not None and not appended.replayed:
        session_values |= {
            "input_tokens": sessions.c.input_tokens + usage.input_tokens,
            "output_tokens": sessions.c.output_tokens + usage.output_tokens,
            "cached_tokens": sessions.c.cached_tokens + usage.cached_tokens,
            "cost_usd": sessions.c.cost_usd + (cost or 0),
        }
    await conn.execute(update(sessions).where(sessions.c.id == session_id).values(**session_values))

    events: list[tuple[str, dict[str, Any]]] = [
        ("entry.committed", {"seq": int(e["seq"]), "kind": e["kind"], "id": e["id"]})
        for e in committed
    ]
    usage_data = (
        {
            "input_tokens": usage.input_tokens,
            "output_tokens": usage.output_tokens,
            "cached_tokens": usage.cached_tokens,
            "estimated": usage.estimated,
        }
        if usage
        else None
    )
    if usage_data is not None:
        events.append(
            ("usage", {**usage_data, "cost_usd": float(cost) if cost is not None else None})
        )
    terminal: dict[str, Any] = {"run_id": run_id, "status": outcome.status, "model": model}
    if outcome.status == "completed":
        terminal |= {
            "text": outcome.text,
            "usage": usage_data,
            "finish_reason": outcome.finish_reason,
        }
    else:
        terminal["partial_text"] = outcome.text
        if outcome.error:
            terminal["error"] = outcome.error
        if run["cancel_mode"]:
            terminal["reason"] = run["cancel_mode"]
    events.append((TERMINAL_EVENTS[outcome.status], terminal))
    rows = event_rows(run_id, next_seq, events)
    await events_db.insert_events(conn, rows)
    await events_db.notify(conn, {run_id: rows[-1]["seq"]})
    return rows
