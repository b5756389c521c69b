"""Run row queries: rows in, typed runs out."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from app.db.tables import runs
from app.runs.model import ACTIVE, Run, RunStatus

_ACTIVE = [s.value for s in ACTIVE]


async def insert_run(conn: AsyncConnection, **values: Any) -> Run:
    query = runs.insert().values(**values).returning(runs)
    return Run.from_row((await conn.execute(query)).mappings().one())


async def get_run(
    conn: AsyncConnection, run_id: str, *, tenant_id: str | None = None, lock: bool = False
) -> Run | None:
    """A run by id; with `tenant_id`, only if it belongs to that tenant."""
    query = select(runs).where(runs.c.id == run_id)
    if tenant_id is not None:
        query = query.where(runs.c.tenant_id == tenant_id)
    if lock:
        query = query.with_for_update()
    return _run((await conn.execute(query)).mappings().one_or_none())


async def find_by_idempotency_key(conn: AsyncConnection, session_id: str, key: str) -> Run | None:
    query = select(runs).where(runs.c.session_id == session_id, runs.c.idempotency_key == key)
    return _run((await conn.execute(query)).mappings().one_or_none())


async def active_runs(conn: AsyncConnection, session_id: str, kind: str | None = None) -> list[Run]:
    """Unfinished runs of a session (of one kind, if given), oldest first."""
    query = (
        select(runs)
        .where(runs.c.session_id == session_id, runs.c.status.in_(_ACTIVE))
        .order_by(runs.c.created_at, runs.c.id)
    )
    if kind is not None:
        query = query.where(runs.c.kind == kind)
    return [Run.from_row(r) for r in (await conn.execute(query)).mappings()]


async def update_run(conn: AsyncConnection, run_id: str, values: dict[str, Any]) -> Run:
    query = update(runs).where(runs.c.id == run_id).values(**values).returning(runs)
    return Run.from_row((await conn.execute(query)).mappings().one())


async def start_attempt(conn: AsyncConnection, run_id: str, status: RunStatus) -> Run:
    """Count a new attempt of the run, now `status` (running)."""
    values = {
        "status": status.value,
        "attempts": runs.c.attempts + 1,
        "started_at": func.coalesce(runs.c.started_at, func.now()),
    }
    return await update_run(conn, run_id, values)


async def expired_actions(conn: AsyncConnection) -> list[Run]:
    """Runs waiting for client tool outputs past their deadline, locked (skipping any another
    worker is expiring right now)."""
    query = (
        select(runs)
        .where(runs.c.status == "requires_action", runs.c.action_expires_at < func.now())
        .with_for_update(skip_locked=True)
    )
    return [Run.from_row(r) for r in (await conn.execute(query)).mappings()]


async def count_asks(conn: AsyncConnection, session_id: str) -> int:
    """The session's turns: runs answering an ask (compactions are not turns)."""
    query = (
        select(func.count())
        .select_from(runs)
        .where(runs.c.session_id == session_id, runs.c.kind == "ask")
    )
    return int((await conn.execute(query)).scalar_one())


def _run(row: Any) -> Run | None:
    return None if row is None else Run.from_row(row)
