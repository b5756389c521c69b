"""Routes for MCP tool servers: register, list, read, update, delete (credentials never shown)."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from fastapi import APIRouter, Response

from app.api.bodies import JSONRoute
from app.api.deps import Config, Engine, Tenant
from app.api.errors import error_responses
from app.api.schemas import McpServerCreate, McpServerList, McpServerOut, McpServerUpdate
from app.services import mcp_servers as service

router = APIRouter(prefix="/v1/mcp_servers", tags=["mcp_servers"], route_class=JSONRoute)


@router.post(
    "",
    operation_id="createMcpServer",
    status_code=201,
    responses=error_responses(400, 401, 409, 413, 422),
)
async def create_mcp_server(
    body: McpServerCreate, engine: Engine, tenant: Tenant, settings: Config
) -> McpServerOut:
    """Register a remote MCP server; sessions and asks attach it by name (`mcp_servers`)."""
    row = await service.register(
        engine,
        settings,
        tenant,
        name=body.name,
        url=body.url,
        transport=body.transport,
        headers=body.headers,
        bearer_token=body.bearer_token,
        allowed_tools=body.allowed_tools,
    )
    return McpServerOut.model_validate(service.describe(row, settings))


@router.get("", operation_id="listMcpServers", responses=error_responses(401, 422))
async def list_mcp_servers(engine: Engine, tenant: Tenant, settings: Config) -> McpServerList:
    rows = await service.list_servers(engine, tenant)
    return McpServerList(
        data=[McpServerOut.model_validate(service.describe(r, settings)) for r in rows]
    )


@router.get("/{server_id}", operation_id="getMcpServer", responses=error_responses(401, 404, 422))
async def get_mcp_server(
    server_id: UUID, engine: Engine, tenant: Tenant, settings: Config
) -> McpServerOut:
    row = await service.get_server(engine, tenant, str(server_id))
    return McpServerOut.model_validate(service.describe(row, settings))


@router.patch(
    "/{server_id}",
    operation_id="updateMcpServer",
    responses=error_responses(400, 401, 404, 413, 422),
)
async def update_mcp_server(
    server_id: UUID, body: McpServerUpdate, engine: Engine, tenant: Tenant, settings: Config
) -> McpServerOut:
    """Change the fields given; headers or bearer_token given replace the stored ones."""
    changes: dict[str, Any] = {}
    for name in body.model_fields_set:
        changes[name] = getattr(body, name)
    if changes.get("bearer_token") == "":
        changes["bearer_token"] = None
    row = await service.update(engine, settings, tenant, str(server_id), **changes)
    return McpServerOut.model_validate(service.describe(row, settings))


@router.delete(
    "/{server_id}",
    operation_id="deleteMcpServer",
    status_code=204,
    responses=error_responses(401, 404, 422),
)
async def delete_mcp_server(server_id: UUID, engine: Engine, tenant: Tenant) -> Response:
    await service.delete(engine, tenant, str(server_id))
    return Response(status_code=204)
