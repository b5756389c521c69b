"""Run row queries."""

from __future__ import annotations

from typing import Any

from sqlalchemy import RowMapping, func, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from app.db.tables import RUN_ACTIVE, runs


async def insert_run(conn: AsyncConnection, **values: Any) -> RowMapping:
    row: RowMapping = (
        (await conn.execute(runs.insert().values(**values).returning(runs))).mappings().one()
    )
    return row


async def get_run(
    conn: AsyncConnection, run_id: str, *, tenant_id: str | None = None, lock: bool = False
) -> RowMapping | None:
    """A run by id; with `tenant_id`, only if it belongs to that tenant."""
    query = select(runs).where(runs.c.id == run_id)
    if tenant_id is not None:
        query = query.where(runs.c.tenant_id == tenant_id)
    if lock:
        query = query.with_for_update()
    return (await conn.execute(query)).mappings().one_or_none()


async def find_by_idempotency_key(
    conn: AsyncConnection, session_id: str, key: str
) -> RowMapping | None:
    query = select(runs).where(runs.c.session_id == session_id, runs.c.idempotency_key == key)
    return (await conn.execute(query)).mappings().one_or_none()


async def active_runs(
    conn: AsyncConnection, session_id: str, kind: str | None = None
) -> list[RowMapping]:
    """Unfinished runs of a session (of one kind, if given), oldest first."""
    query = (
        select(runs)
        .where(runs.c.session_id == session_id, runs.c.status.in_(RUN_ACTIVE))
        .order_by(runs.c.created_at, runs.c.id)
    )
    if kind is not None:
        query = query.where(runs.c.kind == kind)
    return list((await conn.execute(query)).mappings())


async def update_run(conn: AsyncConnection, run_id: str, values: dict[str, Any]) -> RowMapping:
    query = update(runs).where(runs.c.id == run_id).values(**values).returning(runs)
    row: RowMapping = (await conn.execute(query)).mappings().one()
    return row


async def start_attempt(conn: AsyncConnection, run_id: str) -> RowMapping | None:
    """Mark a run running and count the attempt; None if it already ended."""
    query = (
        update(runs)
        .where(runs.c.id == run_id, runs.c.status.in_(RUN_ACTIVE))
        .values(
            status="running",
            attempts=runs.c.attempts + 1,
            started_at=func.coalesce(runs.c.started_at, func.now()),
        )
        .returning(runs)
    )
    row: RowMapping | None = (await conn.execute(query)).mappings().one_or_none()
    return row


async def expired_actions(conn: AsyncConnection) -> list[RowMapping]:
    """Runs waiting for client tool outputs past their deadline, locked (skipping any another
    worker is expiring right now)."""
    query = (
        select(runs)
        .where(runs.c.status == "requires_action", runs.c.action_expires_at < func.now())
        .with_for_update(skip_locked=True)
    )
    return list((await conn.execute(query)).mappings())


async def count_asks(conn: AsyncConnection, session_id: str) -> int:
    """The session's turns: runs answering an ask (compactions are not turns)."""
    query = (
        select(func.count())
        .select_from(runs)
        .where(runs.c.session_id == session_id, runs.c.kind == "ask")
    )
    return int((await conn.execute(query)).scalar_one())
