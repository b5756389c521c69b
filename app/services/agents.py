"""Agents: define an assistant once, change it in immutable versions, create sessions pinned
to a version, and move a session to another version (journaled)."""

from __future__ import annotations

from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.config import Settings
from app.core.agents import AgentPin, parse_reference, resolved
from app.core.entries import EntryKind, NewEntry
from app.core.sessions import Session
from app.db import agents as agents_db
from app.db import sessions as sessions_db
from app.services import sessions as sessions_service
from app.services.errors import Conflict, Invalid, NotFound, session_not_found
from app.services.journal import append_in


def agent_not_found(name: str) -> NotFound:
    return NotFound("agent_not_found", f"no agent {name}", {"agent": name})


def _check(settings: Settings, config: dict[str, Any]) -> None:
    """The models it names are configured, and its reasoning suits its model (422 if not)."""
    sessions_service.check_models(settings, config)
    sessions_service.check_reasoning(settings, config)


async def create_agent(
    engine: AsyncEngine,
    settings: Settings,
    tenant_id: str,
    name: str,
    description: str | None,
    config: dict[str, Any],
    metadata: dict[str, str],
) -> agents_db.Agent:
    _check(settings, config)
    try:
        async with engine.begin() as conn:
            return await agents_db.create_agent(
                conn, tenant_id, name, description, config, metadata
            )
    except IntegrityError as exc:
        if "agents_live_name" not in str(exc.orig):
            raise
        raise Conflict(
            "agent_exists", f"an agent named {name} exists; update it instead", {"agent": name}
        ) from exc


async def get_agent(engine: AsyncEngine, tenant_id: str, name: str) -> agents_db.Agent:
    async with engine.connect() as conn:
        agent = await agents_db.get_agent(conn, tenant_id, name)
    if agent is None:
        raise agent_not_found(name)
    return agent


async def list_agents(engine: AsyncEngine, tenant_id: str) -> list[agents_db.Agent]:
    async with engine.connect() as conn:
        return await agents_db.list_agents(conn, tenant_id)


async def update_agent(
    engine: AsyncEngine,
    settings: Settings,
    tenant_id: str,
    name: str,
    changes: dict[str, Any],
) -> agents_db.Agent:
    """A new version: the latest one's fields, with `changes` (description, config, metadata:
    each replaces the latest's as a whole) over them."""
    async with engine.begin() as conn:
        agent = await agents_db.get_agent(conn, tenant_id, name, lock=True)
        if agent is None:
            raise agent_not_found(name)
        latest = agent.latest
        config = changes.get("config", latest.config)
        _check(settings, config)
        await agents_db.add_version(
            conn,
            agent,
            changes.get("description", latest.description),
            config,
            changes.get("metadata", latest.metadata),
        )
        updated = await agents_db.get_agent(conn, tenant_id, name)
    assert updated is not None
    return updated


async def delete_agent(engine: AsyncEngine, tenant_id: str, name: str) -> None:
    async with engine.begin() as conn:
        agent = await agents_db.get_agent(conn, tenant_id, name, lock=True)
        if agent is None:
            raise agent_not_found(name)
        await agents_db.delete_agent(conn, agent.id)


async def list_versions(
    engine: AsyncEngine, tenant_id: str, name: str
) -> list[agents_db.AgentVersion]:
    async with engine.connect() as conn:
        agent = await agents_db.get_agent(conn, tenant_id, name)
        if agent is None:
            raise agent_not_found(name)
        return await agents_db.versions(conn, agent)


async def get_version(
    engine: AsyncEngine, tenant_id: str, name: str, version: int
) -> agents_db.AgentVersion:
    async with engine.connect() as conn:
        return await version_in(conn, tenant_id, name, version)


async def version_in(
    conn: AsyncConnection, tenant_id: str, name: str, version: int | None
) -> agents_db.AgentVersion:
    """A live agent's version (its latest when `version` is None); 404 if there is none."""
    agent = await agents_db.get_agent(conn, tenant_id, name)
    if agent is None:
        raise agent_not_found(name)
    if version is None:
        return agent.latest
    found = await agents_db.get_version(conn, tenant_id, agent.id, name, version)
    if found is None:
        raise NotFound(
            "agent_version_not_found",
            f"agent {name} has no version {version} (its latest is {agent.latest.version})",
            {"agent": name, "version": version, "latest": agent.latest.version},
        )
    return found


async def pin_for(engine: AsyncEngine, tenant_id: str, reference: str) -> AgentPin:
    """The version `name` or `name@version` refers to, as a session's pin (a session created
    from it is pinned to it: sessions_service.create_session)."""
    parsed = parse_reference(reference)
    if parsed is None:
        raise Invalid(
            "invalid_agent",
            "agent is a name or name@version",
            {"loc": ["body", "agent"], "agent": reference},
        )
    async with engine.connect() as conn:
        found = await version_in(conn, tenant_id, *parsed)
    return AgentPin(found.agent_id, found.name, found.version, found.config)


def check_resolved(settings: Settings, pin: AgentPin, own: dict[str, Any]) -> None:
    _check(settings, resolved(pin.config, own))


async def move_session(
    engine: AsyncEngine,
    settings: Settings,
    tenant_id: str,
    session_id: str,
    version: int | None,
) -> Session:
    """Move a session to another version of its agent (its latest by default): its runs use
    that version's config from now on, and its journal says so (an `agent_version` entry)."""
    async with engine.begin() as conn:
        session = await sessions_db.get_session(conn, tenant_id, session_id, lock=True)
        if session is None:
            raise session_not_found(session_id)
        if session.agent is None:
            raise Conflict(
                "no_agent", "the session was not created from an agent", {"session_id": session_id}
            )
        current = session.agent
        agent = await agents_db.get_agent(conn, tenant_id, current.name)
        if agent is None or agent.id != current.id:
            raise agent_not_found(current.name)
        target = await version_in(conn, tenant_id, current.name, version)
        if target.version == current.version:
            return session
        pin = AgentPin(target.agent_id, target.name, target.version, target.config)
        check_resolved(settings, pin, session.given_config.as_json())
        payload = {
            "agent_id": pin.id,
            "agent_name": pin.name,
            "from_version": current.version,
            "to_version": pin.version,
        }
        await append_in(
            conn,
            tenant_id,
            session_id,
            [NewEntry(EntryKind.AGENT_VERSION, payload, {})],
            session_values=sessions_service.pinned(pin),
        )
        moved = await sessions_db.get_session(conn, tenant_id, session_id)
    assert moved is not None
    return moved
