"""MCP servers: register, list, read, update and delete a tenant's servers; resolve the ones a
run attaches by name, credentials decrypted; re-encrypt every credential under the newest key."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import RowMapping
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.config import Settings
from app.core.mcp import SEPARATOR, SERVER_NAME, McpServer, Transport
from app.credentials import Vault, vault_for
from app.db import mcp_servers as mcp_db
from app.db import runs as runs_db
from app.outbound import OutboundRefused, check_url
from app.services.errors import Conflict, Invalid, NotFound

UNSET: Any = object()  # an update that leaves a field alone


@dataclass(frozen=True)
class Credentials:
    headers: Mapping[str, str]
    bearer_token: str | None

    def as_json(self) -> dict[str, Any]:
        return {"headers": dict(self.headers), "bearer_token": self.bearer_token}

    def request_headers(self) -> dict[str, str]:
        headers = dict(self.headers)
        if self.bearer_token:
            headers["Authorization"] = f"Bearer {self.bearer_token}"
        return headers


def server_not_found(server_id: str) -> NotFound:
    return NotFound("mcp_server_not_found", f"no MCP server {server_id}", {"id": server_id})


def check_name(name: str) -> None:
    if not SERVER_NAME.match(name):
        raise Invalid(
            "invalid_mcp_server_name",
            "an MCP server name is 1-32 letters, digits, - and single _ (its tools are named "
            f"<server>{SEPARATOR}<tool>)",
            {"loc": ["body", "name"], "name": name},
        )


async def check_reach(url: str, settings: Settings) -> None:
    """A clear 400 for a URL tool calls may not reach (outbound_allowed)."""
    try:
        await check_url(url, settings.outbound_allowed)
    except OutboundRefused as exc:
        raise Invalid("url_not_allowed", str(exc), {"loc": ["body", "url"], "url": url}) from exc


def credentials_of(row: RowMapping, vault: Vault) -> Credentials:
    if row["credentials"] is None:
        return Credentials({}, None)
    data = vault.decrypt_json(row["credentials"])
    return Credentials(dict(data.get("headers") or {}), data.get("bearer_token"))


def _sealed(credentials: Credentials, vault: Vault) -> str | None:
    if not credentials.headers and not credentials.bearer_token:
        return None
    return vault.encrypt_json(credentials.as_json())


async def register(
    engine: AsyncEngine,
    settings: Settings,
    tenant_id: str,
    *,
    name: str,
    url: str,
    transport: Transport,
    headers: Mapping[str, str] | None,
    bearer_token: str | None,
    allowed_tools: Sequence[str] | None,
) -> RowMapping:
    check_name(name)
    await check_reach(url, settings)
    sealed = _sealed(Credentials(dict(headers or {}), bearer_token), vault_for(settings))
    try:
        async with engine.begin() as conn:
            return await mcp_db.insert_server(
                conn,
                tenant_id=tenant_id,
                name=name,
                url=url,
                transport=transport,
                allowed_tools=list(allowed_tools) if allowed_tools is not None else None,
                credentials=sealed,
            )
    except IntegrityError as exc:
        raise Conflict(
            "mcp_server_exists", f"an MCP server is already named {name}", {"name": name}
        ) from exc


async def list_servers(engine: AsyncEngine, tenant_id: str) -> list[RowMapping]:
    async with engine.connect() as conn:
        return await mcp_db.list_servers(conn, tenant_id)


async def get_server(engine: AsyncEngine, tenant_id: str, server_id: str) -> RowMapping:
    async with engine.connect() as conn:
        row = await mcp_db.get_server(conn, tenant_id, server_id)
    if row is None:
        raise server_not_found(server_id)
    return row


async def update(
    engine: AsyncEngine,
    settings: Settings,
    tenant_id: str,
    server_id: str,
    *,
    url: Any = UNSET,
    transport: Any = UNSET,
    headers: Any = UNSET,
    bearer_token: Any = UNSET,
    allowed_tools: Any = UNSET,
) -> RowMapping:
    """Change the given fields; headers or bearer_token given replace the stored ones."""
    values: dict[str, Any] = {}
    if url is not UNSET:
        await check_reach(url, settings)
        values["url"] = url
    if transport is not UNSET:
        values["transport"] = transport
    if allowed_tools is not UNSET:
        values["allowed_tools"] = list(allowed_tools) if allowed_tools is not None else None
    vault = vault_for(settings)
    async with engine.begin() as conn:
        row = await mcp_db.get_server(conn, tenant_id, server_id)
        if row is None:
            raise server_not_found(server_id)
        if headers is not UNSET or bearer_token is not UNSET:
            stored = credentials_of(row, vault)
            changed = Credentials(
                dict(headers or {}) if headers is not UNSET else stored.headers,
                bearer_token if bearer_token is not UNSET else stored.bearer_token,
            )
            values["credentials"] = _sealed(changed, vault)
        if not values:
            return row
        updated = await mcp_db.update_server(conn, tenant_id, server_id, **values)
    if updated is None:
        raise server_not_found(server_id)
    return updated


async def delete(engine: AsyncEngine, tenant_id: str, server_id: str) -> None:
    async with engine.begin() as conn:
        if not await mcp_db.delete_server(conn, tenant_id, server_id):
            raise server_not_found(server_id)


async def resolve(
    conn: AsyncConnection,
    settings: Settings,
    tenant_id: str,
    names: Sequence[str],
    inline: Sequence[Mapping[str, Any]] = (),
) -> tuple[list[McpServer], list[str]]:
    """The servers a run uses, in the order named, and the names not found: registered ones
    by name, then those the request described (`RunParams.mcp_inline`), which take the place
    of a registered server of the same name. An inline server without a URL is the registered
    one, with the request's allowed tools and approval setting."""
    registered_names = [*names, *(s["name"] for s in inline if s.get("url") is None)]
    rows = {r["name"]: r for r in await mcp_db.servers_named(conn, tenant_id, registered_names)}
    vault = vault_for(settings)
    servers: dict[str, McpServer] = {}
    missing: list[str] = []
    for name in dict.fromkeys(registered_names):
        row = rows.get(name)
        if row is None:
            missing.append(name)
            continue
        allowed = row["allowed_tools"]
        servers[name] = McpServer(
            name=name,
            url=row["url"],
            transport=row["transport"],
            headers=credentials_of(row, vault).request_headers(),
            allowed_tools=tuple(allowed) if allowed is not None else None,
        )
    for spec in inline:
        name = spec["name"]
        given = spec.get("allowed_tools")
        if spec.get("url") is None:
            base = servers.get(name)
            if base is None:
                continue  # missing, named above
            if given is not None and base.allowed_tools is not None:
                given = [t for t in given if t in base.allowed_tools]
        else:
            sealed = spec.get("headers")
            base = McpServer(
                name=name,
                url=spec["url"],
                headers=vault.decrypt_json(sealed) if sealed else {},
            )
        allowed_tools = tuple(given) if given is not None else base.allowed_tools
        servers[name] = replace(
            base, allowed_tools=allowed_tools, require_approval=spec.get("require_approval")
        )
    return list(servers.values()), missing


def seal_headers(settings: Settings, headers: Mapping[str, str]) -> str | None:
    """Headers a request gave for a server it described, as stored with the run: encrypted."""
    return vault_for(settings).encrypt_json(dict(headers)) if headers else None


async def reencrypt(engine: AsyncEngine, settings: Settings) -> int:
    """Encrypt every stored MCP credential again under the newest key (registered servers',
    and the headers of servers an active run's request described); how many there were."""
    vault = vault_for(settings)
    async with engine.begin() as conn:
        rows = await mcp_db.all_credentials(conn)
        for row in rows:
            await mcp_db.set_credentials(conn, row["id"], vault.rotate(row["credentials"]))
        count = len(rows)
        for run_id, inline in await runs_db.active_inline_mcp(conn):
            sealed = [s for s in inline if s.get("headers")]
            for server in sealed:
                server["headers"] = vault.rotate(server["headers"])
            if sealed:
                await runs_db.set_inline_mcp(conn, run_id, inline)
                count += len(sealed)
    return count


def describe(row: RowMapping, settings: Settings) -> dict[str, Any]:
    """A server as the API shows it: whether credentials are set, never their values."""
    credentials = credentials_of(row, vault_for(settings))
    return {
        "id": str(row["id"]),
        "name": row["name"],
        "url": row["url"],
        "transport": row["transport"],
        "allowed_tools": row["allowed_tools"],
        "credentials": {
            "header_names": sorted(credentials.headers),
            "bearer_token_set": bool(credentials.bearer_token),
        },
        "created_at": row["created_at"],
        "updated_at": row["updated_at"],
    }
