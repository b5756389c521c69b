"""Steering a running run: the messages sent while it works, journaled at its next model turn.

A steer is committed when it is sent (app/services/asks.py) and journaled here, by the run's
worker, only at a model turn's start: every call of the turn before has its result by then, so
no user message ever sits between a tool call and its result. A run that ends first hands its
steers on (run_transitions.finish).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from app.core.entries import EntryKind, NewEntry
from app.core.runs import Run, entry_id
from app.db import steers as steers_db
from app.services.journal import append_in


async def deliver_in(conn: AsyncConnection, run: Run) -> list[tuple[str, dict[str, Any]]]:
    """Journal the run's pending steers as user messages of the run, now (at a model turn's
    start); returns (steer id, committed entry) for each."""
    pending = await steers_db.pending_steers(conn, run.id, lock=True)
    if not pending:
        return []
    entries = [
        NewEntry(
            EntryKind.MESSAGE,
            {"role": "user", "content": s.content},
            {"run_id": run.id, "steer_id": s.id},
            entry_id(run.id, f"steer:{s.id}"),
        )
        for s in pending
    ]
    appended = await append_in(conn, run.tenant_id, run.session_id, entries)
    delivered = []
    for steer, entry in zip(pending, appended.entries, strict=True):
        await steers_db.settle(conn, steer.id, "delivered", int(entry["seq"]))
        delivered.append((steer.id, dict(entry)))
    return delivered
