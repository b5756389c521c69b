"""Session row queries, always scoped by tenant where a caller names a session."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import RowMapping, func, literal, select, tuple_, update
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core.lineage import Segment, lineage_from_json, segments
from app.db.tables import sessions


async def insert_session(conn: AsyncConnection, **values: Any) -> RowMapping:
    result = await conn.execute(sessions.insert().values(**values).returning(sessions))
    row: RowMapping = result.mappings().one()
    return row


async def get_session(
    conn: AsyncConnection, tenant_id: str, session_id: str, *, lock: bool = False
) -> RowMapping | None:
    """One session of this tenant; with `lock`, its row is locked for update too."""
    query = select(sessions).where(sessions.c.id == session_id, sessions.c.tenant_id == tenant_id)
    if lock:
        query = query.with_for_update()
    return (await conn.execute(query)).mappings().one_or_none()


async def list_sessions(
    conn: AsyncConnection,
    tenant_id: str,
    *,
    limit: int,
    before: tuple[datetime, str] | None,
    metadata: dict[str, str],
    title_contains: str | None = None,
    parent_id: str | None = None,
) -> list[RowMapping]:
    """Newest first; `before` is the (created_at, id) keyset cursor of the previous page."""
    query = select(sessions).where(sessions.c.tenant_id == tenant_id)
    if metadata:
        query = query.where(sessions.c.metadata.contains(metadata))
    if title_contains:
        # A substring, case-insensitively: LIKE's wildcards in it are literal characters.
        query = query.where(sessions.c.title.icontains(title_contains, autoescape=True))
    if parent_id is not None:
        query = query.where(sessions.c.parent_id == parent_id)
    if before is not None:
        created_at, session_id = before
        cursor = tuple_(
            literal(created_at, sessions.c.created_at.type), literal(session_id, sessions.c.id.type)
        )
        query = query.where(tuple_(sessions.c.created_at, sessions.c.id) < cursor)
    query = query.order_by(sessions.c.created_at.desc(), sessions.c.id.desc()).limit(limit)
    return list((await conn.execute(query)).mappings())


async def update_session(
    conn: AsyncConnection, session_id: str, values: dict[str, Any]
) -> RowMapping:
    query = (
        update(sessions)
        .where(sessions.c.id == session_id)
        .values(**values, updated_at=func.now())
        .returning(sessions)
    )
    row: RowMapping = (await conn.execute(query)).mappings().one()
    return row


async def delete_session(conn: AsyncConnection, session_id: str) -> None:
    await conn.execute(sessions.delete().where(sessions.c.id == session_id))


# Every transaction that locks several sessions takes the locks in this one order, so forks and
# deletes of related sessions can never deadlock. (A parent sorts before its forks.)
LOCK_ORDER = (sessions.c.created_at, sessions.c.id)


async def sessions_reading_from(conn: AsyncConnection, session_id: str) -> list[RowMapping]:
    """Every session whose thread includes entries stored under `session_id`, locked."""
    query = (
        select(sessions.c.id, sessions.c.lineage)
        .where(sessions.c.lineage.contains([{"session_id": session_id}]))
        .order_by(*LOCK_ORDER)
        .with_for_update()
    )
    return list((await conn.execute(query)).mappings())


async def lock_existing(conn: AsyncConnection, session_ids: list[str]) -> int:
    """Key-share lock these sessions so none is deleted meanwhile; return how many exist."""
    if not session_ids:
        return 0
    query = (
        select(sessions.c.id)
        .where(sessions.c.id.in_(session_ids))
        .order_by(*LOCK_ORDER)
        .with_for_update(key_share=True, read=True)
    )
    return len((await conn.execute(query)).all())


async def advance_rev(
    conn: AsyncConnection,
    tenant_id: str,
    session_id: str,
    count: int,
    tokens: int,
    expected_rev: int | None,
) -> int | None:
    """Reserve `count` seqs by moving rev forward; the row lock serializes appenders.

    Returns the new rev, or None when the session's rev is not `expected_rev` (or the tenant has
    no such session). The lock is held until the transaction ends, so the seqs stay dense.
    """
    query = update(sessions).where(sessions.c.id == session_id, sessions.c.tenant_id == tenant_id)
    if expected_rev is not None:
        query = query.where(sessions.c.rev == expected_rev)
    query = query.values(
        rev=sessions.c.rev + count,
        token_total=sessions.c.token_total + tokens,
        updated_at=func.now(),
    ).returning(sessions.c.rev)
    rev: int | None = (await conn.execute(query)).scalar()
    return rev


async def current_rev(conn: AsyncConnection, tenant_id: str, session_id: str) -> int | None:
    query = select(sessions.c.rev).where(
        sessions.c.id == session_id, sessions.c.tenant_id == tenant_id
    )
    rev: int | None = (await conn.execute(query)).scalar()
    return rev


def thread_of(session: RowMapping) -> list[Segment]:
    """The storage ranges of a session row's thread: its ancestors' prefixes, then its own."""
    return segments(str(session["id"]), lineage_from_json(session["lineage"]), int(session["rev"]))
