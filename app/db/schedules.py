"""Schedules' rows and their firings (one per due time: schedule_firings_once)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import RowMapping, delete, func, insert, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core.schedules import Misfire
from app.db.tables import runs, schedule_firings, schedules


@dataclass(frozen=True, slots=True)
class Schedule:
    id: str
    tenant_id: str
    name: str
    cron: str
    timezone: str
    misfire: Misfire
    busy: Literal["queue", "skip"]
    enabled: bool
    session_id: str | None
    agent: str | None
    agent_version: int | None
    title_template: str | None
    ask: dict[str, Any]
    next_due_at: datetime
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class ScheduleFiring:
    id: str
    due_at: datetime
    status: Literal["fired", "skipped", "failed"]
    reason: str | None
    message: str | None
    session_id: str | None
    run_id: str | None
    run_status: str | None
    created_at: datetime


def _schedule(row: RowMapping) -> Schedule:
    return Schedule(
        str(row["id"]),
        str(row["tenant_id"]),
        row["name"],
        row["cron"],
        row["timezone"],
        row["misfire"],
        row["busy"],
        row["enabled"],
        row["session_id"],
        row["agent"],
        row["agent_version"],
        row["title_template"],
        dict(row["ask"]),
        row["next_due_at"],
        row["created_at"],
        row["updated_at"],
    )


async def insert_schedule(conn: AsyncConnection, **values: Any) -> Schedule:
    row = (await conn.execute(insert(schedules).values(**values).returning(schedules))).mappings()
    return _schedule(row.one())


async def get_schedule(
    conn: AsyncConnection, tenant_id: str | None, schedule_id: str, lock: bool = False
) -> Schedule | None:
    query = select(schedules).where(schedules.c.id == schedule_id)
    if tenant_id is not None:
        query = query.where(schedules.c.tenant_id == tenant_id)
    if lock:
        query = query.with_for_update()
    row = (await conn.execute(query)).mappings().one_or_none()
    return _schedule(row) if row is not None else None


async def list_schedules(conn: AsyncConnection, tenant_id: str) -> list[Schedule]:
    query = (
        select(schedules)
        .where(schedules.c.tenant_id == tenant_id)
        .order_by(schedules.c.created_at, schedules.c.id)
    )
    return [_schedule(r) for r in (await conn.execute(query)).mappings()]


async def update_schedule(
    conn: AsyncConnection, schedule_id: str, values: dict[str, Any]
) -> Schedule:
    query = (
        update(schedules)
        .where(schedules.c.id == schedule_id)
        .values(**values, updated_at=func.now())
        .returning(schedules)
    )
    return _schedule((await conn.execute(query)).mappings().one())


async def advance(conn: AsyncConnection, schedule_id: str, next_due_at: datetime) -> None:
    """The schedule's next due time, after a firing (not a change of the schedule's own)."""
    query = update(schedules).where(schedules.c.id == schedule_id).values(next_due_at=next_due_at)
    await conn.execute(query)


async def delete_schedule(conn: AsyncConnection, tenant_id: str, schedule_id: str) -> bool:
    query = delete(schedules).where(
        (schedules.c.id == schedule_id) & (schedules.c.tenant_id == tenant_id)
    )
    return bool((await conn.execute(query)).rowcount)


async def due_schedule_ids(conn: AsyncConnection, now: datetime, limit: int) -> list[str]:
    query = (
        select(schedules.c.id)
        .where(schedules.c.enabled & (schedules.c.next_due_at <= now))
        .order_by(schedules.c.next_due_at)
        .limit(limit)
    )
    return [str(i) for i in (await conn.execute(query)).scalars()]


async def insert_firing(
    conn: AsyncConnection, schedule_id: str, due_at: datetime, **values: Any
) -> bool:
    """The due time's firing; False when it has one already (another worker fired it)."""
    query = (
        pg_insert(schedule_firings)
        .values(schedule_id=schedule_id, due_at=due_at, **values)
        .on_conflict_do_nothing(constraint="schedule_firings_once")
        .returning(schedule_firings.c.id)
    )
    return (await conn.execute(query)).scalar_one_or_none() is not None


async def list_firings(conn: AsyncConnection, schedule_id: str, limit: int) -> list[ScheduleFiring]:
    query = (
        select(schedule_firings, runs.c.status.label("run_status"))
        .outerjoin(runs, runs.c.id == schedule_firings.c.run_id)
        .where(schedule_firings.c.schedule_id == schedule_id)
        .order_by(schedule_firings.c.due_at.desc())
        .limit(limit)
    )
    return [
        ScheduleFiring(
            str(r["id"]),
            r["due_at"],
            r["status"],
            r["reason"],
            r["message"],
            r["session_id"],
            r["run_id"],
            r["run_status"],
            r["created_at"],
        )
        for r in (await conn.execute(query)).mappings()
    ]
