"""Tenant and API-key queries."""

from __future__ import annotations

from sqlalchemy import select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection

from app.db.tables import api_keys, tenants


async def ensure_tenant(conn: AsyncConnection, name: str) -> str:
    """The id of the tenant called `name`, created if it does not exist yet."""
    await conn.execute(insert(tenants).values(name=name).on_conflict_do_nothing())
    tenant_id = await conn.scalar(select(tenants.c.id).where(tenants.c.name == name))
    assert tenant_id is not None
    return str(tenant_id)


async def insert_key(
    conn: AsyncConnection, tenant_id: str, key_hash: str, prefix: str, name: str | None
) -> None:
    await conn.execute(
        api_keys.insert().values(tenant_id=tenant_id, key_hash=key_hash, prefix=prefix, name=name)
    )


async def tenant_for_key_hash(conn: AsyncConnection, key_hash: str) -> str | None:
    tenant_id = await conn.scalar(
        select(api_keys.c.tenant_id).where(
            api_keys.c.key_hash == key_hash, api_keys.c.revoked_at.is_(None)
        )
    )
    return str(tenant_id) if tenant_id is not None else None


async def set_session_ttl(conn: AsyncConnection, tenant_id: str, ttl_seconds: int | None) -> None:
    await conn.execute(
        update(tenants).where(tenants.c.id == tenant_id).values(session_ttl_seconds=ttl_seconds)
    )
