"""Agents' rows: a tenant's named agents and their immutable versions."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import RowMapping, func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from app.db.tables import agent_versions, agents


@dataclass(frozen=True, slots=True)
class AgentVersion:
    agent_id: str
    name: str
    version: int
    description: str | None
    config: dict[str, Any]
    metadata: dict[str, str]
    created_at: datetime


@dataclass(frozen=True, slots=True)
class Agent:
    id: str
    name: str
    latest: AgentVersion
    created_at: datetime
    updated_at: datetime
    deleted_at: datetime | None


def _version(name: str, row: RowMapping) -> AgentVersion:
    return AgentVersion(
        str(row["agent_id"]),
        name,
        int(row["version"]),
        row["description"],
        dict(row["config"]),
        dict(row["metadata"]),
        row["created_at"],
    )


_AGENT_COLUMNS = (
    agents.c.id,
    agents.c.name,
    agents.c.created_at.label("agent_created_at"),
    agents.c.updated_at,
    agents.c.deleted_at,
    agent_versions.c.agent_id,
    agent_versions.c.version,
    agent_versions.c.description,
    agent_versions.c.config,
    agent_versions.c.metadata,
    agent_versions.c.created_at,
)


def _agent(row: RowMapping) -> Agent:
    return Agent(
        str(row["id"]),
        row["name"],
        _version(row["name"], row),
        row["agent_created_at"],
        row["updated_at"],
        row["deleted_at"],
    )


def _with_latest() -> Any:
    return select(*_AGENT_COLUMNS).join(
        agent_versions,
        (agent_versions.c.agent_id == agents.c.id)
        & (agent_versions.c.version == agents.c.latest_version),
    )


async def create_agent(
    conn: AsyncConnection,
    tenant_id: str,
    name: str,
    description: str | None,
    config: dict[str, Any],
    metadata: dict[str, str],
) -> Agent:
    agent_id = str(uuid.uuid4())
    await conn.execute(
        insert(agents).values(id=agent_id, tenant_id=tenant_id, name=name, latest_version=1)
    )
    await conn.execute(
        insert(agent_versions).values(
            agent_id=agent_id, version=1, description=description, config=config, metadata=metadata
        )
    )
    found = await get_agent(conn, tenant_id, name)
    assert found is not None
    return found


async def get_agent(
    conn: AsyncConnection, tenant_id: str, name: str, *, lock: bool = False
) -> Agent | None:
    """The tenant's live agent of this name, with its latest version."""
    query = _with_latest().where(
        agents.c.tenant_id == tenant_id, agents.c.name == name, agents.c.deleted_at.is_(None)
    )
    if lock:
        query = query.with_for_update(of=agents)
    row = (await conn.execute(query)).mappings().one_or_none()
    return _agent(row) if row is not None else None


async def list_agents(conn: AsyncConnection, tenant_id: str) -> list[Agent]:
    query = (
        _with_latest()
        .where(agents.c.tenant_id == tenant_id, agents.c.deleted_at.is_(None))
        .order_by(agents.c.name)
    )
    return [_agent(r) for r in (await conn.execute(query)).mappings()]


async def add_version(
    conn: AsyncConnection,
    agent: Agent,
    description: str | None,
    config: dict[str, Any],
    metadata: dict[str, str],
) -> int:
    """A new version of `agent` (locked by the caller): the latest one's number plus one."""
    version = agent.latest.version + 1
    await conn.execute(
        insert(agent_versions).values(
            agent_id=agent.id,
            version=version,
            description=description,
            config=config,
            metadata=metadata,
        )
    )
    await conn.execute(
        update(agents)
        .where(agents.c.id == agent.id)
        .values(latest_version=version, updated_at=func.now())
    )
    return version


async def delete_agent(conn: AsyncConnection, agent_id: str) -> None:
    """Gone from the tenant's agents; its versions stay, for the sessions pinned to them."""
    await conn.execute(update(agents).where(agents.c.id == agent_id).values(deleted_at=func.now()))


async def versions(conn: AsyncConnection, agent: Agent) -> list[AgentVersion]:
    query = (
        select(agent_versions)
        .where(agent_versions.c.agent_id == agent.id)
        .order_by(agent_versions.c.version)
    )
    return [_version(agent.name, r) for r in (await conn.execute(query)).mappings()]


async def get_version(
    conn: AsyncConnection, tenant_id: str, agent_id: str, name: str, version: int
) -> AgentVersion | None:
    """A version of one of the tenant's agents, deleted or not (a pinned session reads it)."""
    query = (
        select(agent_versions)
        .join(agents, agents.c.id == agent_versions.c.agent_id)
        .where(
            agents.c.tenant_id == tenant_id,
            agent_versions.c.agent_id == agent_id,
            agent_versions.c.version == version,
        )
    )
    row = (await conn.execute(query)).mappings().one_or_none()
    return _version(name, row) if row is not None else None
