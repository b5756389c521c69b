"""Memory row queries, always scoped by tenant: one row per (tenant, namespace)."""

from __future__ import annotations

from sqlalchemy import Integer, RowMapping, case, cast, func, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection

from app.db.tables import memories

# A memory's size and line count, computed where it is stored so that listing never moves the
# contents. Lines are "\n"-terminated, plus a last unterminated one (as the service counts).
BYTES = func.octet_length(memories.c.content)
LINES = (
    func.length(memories.c.content)
    - func.length(func.replace(memories.c.content, "\n", ""))
    + case(
        (
            (memories.c.content != "") & (func.right(memories.c.content, 1) != "\n"),
            1,
        ),
        else_=0,
    )
)


async def get_memory(
    conn: AsyncConnection, tenant_id: str, namespace: str, *, lock: bool = False
) -> RowMapping | None:
    """One memory of this tenant; with `lock`, its row is locked for update too."""
    query = select(memories).where(
        memories.c.tenant_id == tenant_id, memories.c.namespace == namespace
    )
    if lock:
        query = query.with_for_update()
    return (await conn.execute(query)).mappings().one_or_none()


async def put_memory(
    conn: AsyncConnection,
    tenant_id: str,
    namespace: str,
    content: str,
    *,
    expected_version: int | None = None,
) -> RowMapping | None:
    """Write a memory's content; returns the new row, or None when `expected_version` did not
    hold. None: create or replace. 0: create only (the version of a memory that does not exist).
    n > 0: replace only version n. Each write is atomic, so two racing writers expecting the
    same version never both succeed."""
    if expected_version is not None and expected_version > 0:
        query = (
            update(memories)
            .where(
                memories.c.tenant_id == tenant_id,
                memories.c.namespace == namespace,
                memories.c.version == expected_version,
            )
            .values(content=content, version=memories.c.version + 1, updated_at=func.now())
            .returning(memories)
        )
        updated: RowMapping | None = (await conn.execute(query)).mappings().one_or_none()
        return updated
    new = insert(memories).values(tenant_id=tenant_id, namespace=namespace, content=content)
    if expected_version == 0:
        created = new.on_conflict_do_nothing(index_elements=["tenant_id", "namespace"])
        inserted: RowMapping | None = (
            (await conn.execute(created.returning(memories))).mappings().one_or_none()
        )
        return inserted
    upsert = new.on_conflict_do_update(
        index_elements=["tenant_id", "namespace"],
        set_={
            "content": new.excluded.content,
            "version": memories.c.version + 1,
            "updated_at": func.now(),
        },
    )
    row: RowMapping = (await conn.execute(upsert.returning(memories))).mappings().one()
    return row


async def list_memories(
    conn: AsyncConnection,
    tenant_id: str,
    *,
    limit: int,
    after: str | None = None,
    prefix: str | None = None,
) -> list[RowMapping]:
    """Namespaces in order, without their contents; `after` is the previous page's last one."""
    query = select(
        memories.c.namespace,
        memories.c.version,
        cast(BYTES, Integer).label("bytes"),
        cast(LINES, Integer).label("lines"),
        memories.c.created_at,
        memories.c.updated_at,
    ).where(memories.c.tenant_id == tenant_id)
    if after is not None:
        query = query.where(memories.c.namespace > after)
    if prefix:
        query = query.where(memories.c.namespace.startswith(prefix, autoescape=True))
    # The column is COLLATE "C": the order and the cursor follow the primary key's index.
    query = query.order_by(memories.c.namespace).limit(limit)
    return list((await conn.execute(query)).mappings())


async def delete_memory(
    conn: AsyncConnection, tenant_id: str, namespace: str, *, expected_version: int | None = None
) -> bool:
    """Whether a row was deleted (with `expected_version`: only that version is)."""
    query = memories.delete().where(
        memories.c.tenant_id == tenant_id, memories.c.namespace == namespace
    )
    if expected_version is not None:
        query = query.where(memories.c.version == expected_version)
    result = await conn.execute(query.returning(memories.c.version))
    return result.first() is not None
