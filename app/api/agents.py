"""Routes for agents: named, versioned configurations that sessions are created from."""

from __future__ import annotations

from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Path, Response

from app.api.bodies import JSONRoute
from app.api.deps import Config, Engine, Tenant
from app.api.errors import error_responses
from app.api.schemas import (
    Agent,
    AgentCreate,
    AgentList,
    AgentUpdate,
    AgentVersion,
    AgentVersionList,
    Session,
    SessionAgentMove,
)
from app.db import agents as agents_db
from app.services import agents as service

router = APIRouter(tags=["agents"], route_class=JSONRoute)

Name = Annotated[str, Path(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]


def _agent(agent: agents_db.Agent) -> Agent:
    latest = agent.latest
    return Agent(
        id=agent.id,
        name=agent.name,
        version=latest.version,
        description=latest.description,
        config=latest.config,
        metadata=latest.metadata,
        created_at=agent.created_at,
        updated_at=agent.updated_at,
    )


def _version(version: agents_db.AgentVersion) -> AgentVersion:
    return AgentVersion(
        name=version.name,
        version=version.version,
        description=version.description,
        config=version.config,
        metadata=version.metadata,
        created_at=version.created_at,
    )


@router.post(
    "/v1/agents",
    operation_id="createAgent",
    status_code=201,
    responses=error_responses(400, 401, 409, 413, 422),
)
async def create_agent(
    body: AgentCreate, engine: Engine, tenant: Tenant, settings: Config
) -> Agent:
    """Define an agent: its version 1."""
    agent = await service.create_agent(
        engine,
        settings,
        tenant,
        body.name,
        body.description,
        body.config.model_dump(mode="json", exclude_none=True),
        body.metadata,
    )
    return _agent(agent)


@router.get("/v1/agents", operation_id="listAgents", responses=error_responses(401, 422))
async def list_agents(engine: Engine, tenant: Tenant) -> AgentList:
    return AgentList(data=[_agent(a) for a in await service.list_agents(engine, tenant)])


@router.get("/v1/agents/{name}", operation_id="getAgent", responses=error_responses(401, 404, 422))
async def get_agent(name: Name, engine: Engine, tenant: Tenant) -> Agent:
    return _agent(await service.get_agent(engine, tenant, name))


@router.patch(
    "/v1/agents/{name}",
    operation_id="updateAgent",
    responses=error_responses(400, 401, 404, 413, 422),
)
async def update_agent(
    name: Name, body: AgentUpdate, engine: Engine, tenant: Tenant, settings: Config
) -> Agent:
    """A new version: the fields given replace the latest version's (versions never change;
    sessions stay on the version they are pinned to)."""
    # A null is no change (a version's config and metadata are never absent).
    changes = {
        k: v for k, v in body.model_dump(mode="json", exclude_unset=True).items() if v is not None
    }
    if body.config is not None:
        changes["config"] = body.config.model_dump(mode="json", exclude_none=True)
    return _agent(await service.update_agent(engine, settings, tenant, name, changes))


@router.delete(
    "/v1/agents/{name}",
    operation_id="deleteAgent",
    status_code=204,
    responses=error_responses(401, 404, 422),
)
async def delete_agent(name: Name, engine: Engine, tenant: Tenant) -> Response:
    """Gone from the list; the sessions pinned to its versions keep them."""
    await service.delete_agent(engine, tenant, name)
    return Response(status_code=204)


@router.get(
    "/v1/agents/{name}/versions",
    operation_id="listAgentVersions",
    responses=error_responses(401, 404, 422),
)
async def list_versions(name: Name, engine: Engine, tenant: Tenant) -> AgentVersionList:
    versions = await service.list_versions(engine, tenant, name)
    return AgentVersionList(data=[_version(v) for v in versions])


@router.get(
    "/v1/agents/{name}/versions/{version}",
    operation_id="getAgentVersion",
    responses=error_responses(401, 404, 422),
)
async def get_version(
    name: Name, version: Annotated[int, Path(ge=1, le=999_999_999)], engine: Engine, tenant: Tenant
) -> AgentVersion:
    return _version(await service.get_version(engine, tenant, name, version))


@router.post(
    "/v1/sessions/{session_id}/agent_version",
    operation_id="moveSessionAgentVersion",
    tags=["sessions"],
    responses=error_responses(400, 401, 404, 409, 422),
)
async def move_session(
    session_id: UUID, body: SessionAgentMove, engine: Engine, tenant: Tenant, settings: Config
) -> Session:
    """Move the session to another version of its agent (default: the latest); its journal
    records the move (an `agent_version` entry), and its runs use that version from now on."""
    moved = await service.move_session(engine, settings, tenant, str(session_id), body.version)
    return Session.of(moved)
