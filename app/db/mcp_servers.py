"""MCP server queries: a tenant's registered servers, by id or by name."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import RowMapping, func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from app.db.tables import mcp_servers


async def insert_server(conn: AsyncConnection, **values: Any) -> RowMapping:
    query = mcp_servers.insert().values(**values).returning(mcp_servers)
    row: RowMapping = (await conn.execute(query)).mappings().one()
    return row


async def list_servers(conn: AsyncConnection, tenant_id: str) -> list[RowMapping]:
    query = (
        select(mcp_servers).where(mcp_servers.c.tenant_id == tenant_id).order_by(mcp_servers.c.name)
    )
    return list((await conn.execute(query)).mappings())


async def get_server(conn: AsyncConnection, tenant_id: str, server_id: str) -> RowMapping | None:
    query = select(mcp_servers).where(
        mcp_servers.c.id == server_id, mcp_servers.c.tenant_id == tenant_id
    )
    return (await conn.execute(query)).mappings().one_or_none()


async def servers_named(
    conn: AsyncConnection, tenant_id: str, names: Sequence[str]
) -> list[RowMapping]:
    query = select(mcp_servers).where(
        mcp_servers.c.tenant_id == tenant_id, mcp_servers.c.name.in_(list(names))
    )
    return list((await conn.execute(query)).mappings())


async def update_server(
    conn: AsyncConnection, tenant_id: str, server_id: str, **values: Any
) -> RowMapping | None:
    query = (
        mcp_servers.update()
        .where(mcp_servers.c.id == server_id, mcp_servers.c.tenant_id == tenant_id)
        .values(**values, updated_at=func.now())
        .returning(mcp_servers)
    )
    row: RowMapping | None = (await conn.execute(query)).mappings().one_or_none()
    return row


async def delete_server(conn: AsyncConnection, tenant_id: str, server_id: str) -> bool:
    query = mcp_servers.delete().where(
        mcp_servers.c.id == server_id, mcp_servers.c.tenant_id == tenant_id
    )
    return bool((await conn.execute(query)).rowcount)


async def all_credentials(conn: AsyncConnection) -> list[RowMapping]:
    """Every stored credential (for re-encryption under the newest key)."""
    query = select(mcp_servers.c.id, mcp_servers.c.credentials).where(
        mcp_servers.c.credentials.is_not(None)
    )
    return list((await conn.execute(query)).mappings())


async def set_credentials(conn: AsyncConnection, server_id: str, credentials: str) -> None:
    await conn.execute(
        mcp_servers.update().where(mcp_servers.c.id == server_id).values(credentials=credentials)
    )
