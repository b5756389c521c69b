"""Steers' rows: a message waiting for a running run's next model turn, and where it landed."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from sqlalchemy import RowMapping, Select, bindparam, func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from app.db.tables import sessions, steers


@dataclass(frozen=True, slots=True)
class Steer:
    id: str
    tenant_id: str
    session_id: str
    run_id: str
    content: str | list[dict[str, Any]]
    model: str
    params: dict[str, Any]
    idempotency_key: str | None = None

    @classmethod
    def from_row(cls, row: RowMapping) -> Steer:
        return cls(
            str(row["id"]),
            str(row["tenant_id"]),
            str(row["session_id"]),
            str(row["run_id"]),
            row["content"],
            row["model"],
            dict(row["params"]),
            row["idempotency_key"],
        )


async def insert_steer(conn: AsyncConnection, steer: Steer) -> None:
    """The steer, and its session's row written with it (updated_at): a run's end written on
    condition that the row is as it read it (app/db/runs.end_run's `as_read`) then sees that a
    steer came, whatever the order in which the two statements take the row."""
    touched = (
        update(sessions)
        .where(sessions.c.id == bindparam("touched_session"))
        .values(updated_at=func.now())
        .cte("touched")
    )
    await conn.execute(
        insert(steers)
        .add_cte(touched)
        .values(
            id=steer.id,
            tenant_id=steer.tenant_id,
            session_id=steer.session_id,
            run_id=steer.run_id,
            content=steer.content,
            model=steer.model,
            params=steer.params,
            idempotency_key=steer.idempotency_key,
        ),
        {"touched_session": steer.session_id},
    )


async def find_by_idempotency_key(conn: AsyncConnection, session_id: str, key: str) -> Steer | None:
    query = select(steers).where(steers.c.session_id == session_id, steers.c.idempotency_key == key)
    row = (await conn.execute(query)).mappings().one_or_none()
    return None if row is None else Steer.from_row(row)


async def any_pending(conn: AsyncConnection, run_id: str) -> bool:
    query = select(steers.c.id).where(steers.c.run_id == run_id, steers.c.status == "pending")
    return (await conn.execute(query.limit(1))).first() is not None


async def pending_steers(conn: AsyncConnection, run_id: str, *, lock: bool = False) -> list[Steer]:
    """The run's steers not settled yet, oldest first (locked: the caller settles them)."""
    rows = (await conn.execute(_pending_steers(lock), {"run_id": run_id})).mappings()
    return [Steer.from_row(r) for r in rows]


@functools.cache  # built once per shape: constructing it cost more CPU than running it
def _pending_steers(lock: bool) -> Select[Any]:
    query = (
        select(steers)
        .where(steers.c.run_id == bindparam("run_id"), steers.c.status == "pending")
        .order_by(steers.c.created_at, steers.c.id)
    )
    return query.with_for_update() if lock else query


async def settle(
    conn: AsyncConnection,
    steer_id: str,
    status: str,
    entry_seq: int,
    next_run_id: str | None = None,
) -> None:
    await conn.execute(
        update(steers)
        .where(steers.c.id == steer_id)
        .values(status=status, entry_seq=entry_seq, next_run_id=next_run_id, settled_at=func.now())
    )
