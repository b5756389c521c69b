"""The tool_approvals table: a run's calls that wait for a person, their rulings, and the
one claim to run each approved call."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core.approvals import Decision
from app.db.tables import tool_approvals


@dataclass(frozen=True)
class Approval:
    run_id: str
    tool_call_id: str
    name: str
    arguments: dict[str, Any]
    decision: Decision | None
    edited_arguments: dict[str, Any] | None
    reason: str | None
    requested_at: datetime
    decided_at: datetime | None
    executed_at: datetime | None

    @classmethod
    def from_row(cls, row: Any) -> Approval:
        return cls(
            run_id=str(row["run_id"]),
            tool_call_id=row["tool_call_id"],
            name=row["name"],
            arguments=dict(row["arguments"]),
            decision=row["decision"],
            edited_arguments=row["edited_arguments"],
            reason=row["reason"],
            requested_at=row["requested_at"],
            decided_at=row["decided_at"],
            executed_at=row["executed_at"],
        )

    @property
    def effective_arguments(self) -> dict[str, Any]:
        return self.edited_arguments if self.edited_arguments is not None else self.arguments


async def request(conn: AsyncConnection, run_id: str, calls: Sequence[dict[str, Any]]) -> None:
    """A row per call ({tool_call_id, name, arguments}) waiting for its ruling; a call asked
    about before (a retried attempt) keeps its row."""
    if not calls:
        return
    rows = [
        {
            "run_id": run_id,
            "tool_call_id": c["tool_call_id"],
            "name": c["name"],
            "arguments": c["arguments"],
        }
        for c in calls
    ]
    await conn.execute(insert(tool_approvals).values(rows).on_conflict_do_nothing())


async def of_run(conn: AsyncConnection, run_id: str) -> list[Approval]:
    """The run's approvals, in the order they were asked for."""
    query = (
        select(tool_approvals)
        .where(tool_approvals.c.run_id == run_id)
        .order_by(tool_approvals.c.requested_at, tool_approvals.c.tool_call_id)
    )
    return [Approval.from_row(r) for r in (await conn.execute(query)).mappings()]


async def decide(
    conn: AsyncConnection,
    run_id: str,
    tool_call_id: str,
    decision: Decision,
    *,
    edited_arguments: dict[str, Any] | None = None,
    reason: str | None = None,
) -> Approval | None:
    """Rule on a waiting call; None if it was ruled on already (the ruling stands)."""
    query = (
        update(tool_approvals)
        .where(
            tool_approvals.c.run_id == run_id,
            tool_approvals.c.tool_call_id == tool_call_id,
            tool_approvals.c.decision.is_(None),
        )
        .values(
            decision=decision,
            edited_arguments=edited_arguments,
            reason=reason,
            decided_at=func.now(),
        )
        .returning(tool_approvals)
    )
    row = (await conn.execute(query)).mappings().one_or_none()
    return None if row is None else Approval.from_row(row)


async def claim_execution(conn: AsyncConnection, run_id: str, tool_call_id: str) -> bool:
    """Take the one right to run an approved call: True for the first caller only, ever."""
    query = (
        update(tool_approvals)
        .where(
            tool_approvals.c.run_id == run_id,
            tool_approvals.c.tool_call_id == tool_call_id,
            tool_approvals.c.decision == "approved",
            tool_approvals.c.executed_at.is_(None),
        )
        .values(executed_at=func.now())
        .returning(tool_approvals.c.tool_call_id)
    )
    return (await conn.execute(query)).first() is not None
