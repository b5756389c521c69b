"""The admin API (/v1/admin, THREADLINE_ADMIN_KEY): tenants, their keys, limits and usage.

What `threadline keys`, `threadline tenants limits` and `threadline usage` do, over HTTP.
"""

from __future__ import annotations

from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Depends, Path, Query

from app.api.admin_schemas import (
    TENANT_NAME_PATTERN,
    ApiKey,
    ApiKeyList,
    IssuedKey,
    KeyCreate,
    KeyRotate,
    LimitValues,
    Tenant,
    TenantCreate,
    TenantLimits,
    TenantList,
    UsageReport,
)
from app.api.bodies import JSONRoute
from app.api.deps import Config, Engine, KnownKeys, require_admin
from app.api.errors import error_responses
from app.api.usage import From, To, parse_day
from app.db import tenants as tenants_db
from app.services import keys as keys_service
from app.services import quotas
from app.services.errors import Conflict
from app.services.key_cache import KeyCache

router = APIRouter(
    prefix="/v1/admin",
    tags=["admin"],
    route_class=JSONRoute,
    dependencies=[Depends(require_admin)],
)
TenantPath = Annotated[str, Path(pattern=TENANT_NAME_PATTERN, description="The tenant's name.")]


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The admin key has no requests-per-minute limit: no 429."""
    return {s: r for s, r in error_responses(*statuses).items() if s != 429}


@router.get("/tenants", operation_id="adminListTenants", responses=_errors(401, 404, 422))
async def list_tenants(engine: Engine) -> TenantList:
    async with engine.connect() as conn:
        rows = await tenants_db.list_tenants(conn)
    return TenantList(data=[Tenant.model_validate({**r, "id": str(r["id"])}) for r in rows])


@router.post(
    "/tenants",
    operation_id="adminCreateTenant",
    status_code=201,
    responses=_errors(400, 401, 404, 409, 413, 422),
)
async def create_tenant(body: TenantCreate, engine: Engine) -> Tenant:
    """A tenant without keys (409 when the name is taken)."""
    async with engine.begin() as conn:
        if await tenants_db.tenant_by_name(conn, body.name) is not None:
            raise Conflict("tenant_exists", f"a tenant is named {body.name}", {"tenant": body.name})
        await tenants_db.ensure_tenant(conn, body.name)
        row = await tenants_db.tenant_by_name(conn, body.name)
    assert row is not None
    return Tenant.model_validate({**row, "id": str(row["id"]), "active_keys": 0})


@router.get(
    "/tenants/{tenant}/keys",
    operation_id="adminListKeys",
    responses=_errors(401, 404, 422),
)
async def list_keys(tenant: TenantPath, engine: Engine) -> ApiKeyList:
    """The tenant's keys, revoked ones included; never the keys themselves."""
    return ApiKeyList(data=[ApiKey.of(k) for k in await keys_service.list_keys(engine, tenant)])


@router.post(
    "/tenants/{tenant}/keys",
    operation_id="adminCreateKey",
    status_code=201,
    responses=_errors(400, 401, 404, 413, 422),
)
async def create_key(tenant: TenantPath, body: KeyCreate, engine: Engine) -> IssuedKey:
    """A new key (the tenant is created if new); the key is in this answer only."""
    issued = await keys_service.issue_key(engine, tenant, body.name, read_only=body.read_only)
    return IssuedKey.issued(issued)


@router.post(
    "/keys/{key_id}/revoke",
    operation_id="adminRevokeKey",
    responses=_errors(401, 404, 422),
)
async def revoke_key(key_id: UUID, engine: Engine, known: KnownKeys) -> ApiKey:
    """Every API process refuses the key from now on (401): this one at once, the others as
    soon as the database's notification reaches them (milliseconds)."""
    revoked = await keys_service.revoke_key(engine, str(key_id))
    _forget(known)
    return ApiKey.of(revoked)


@router.post(
    "/keys/{key_id}/rotate",
    operation_id="adminRotateKey",
    status_code=201,
    responses=_errors(400, 401, 404, 413, 422),
)
async def rotate_key(
    key_id: UUID, engine: Engine, known: KnownKeys, body: KeyRotate | None = None
) -> IssuedKey:
    """A new key with the same tenant, name and scope; the old one is revoked at once, or
    after `grace_seconds`."""
    grace = (body or KeyRotate()).grace_seconds
    rotated = await keys_service.rotate_key(engine, str(key_id), grace_seconds=grace)
    _forget(known)
    return IssuedKey.issued(rotated)


@router.get(
    "/tenants/{tenant}/limits",
    operation_id="adminGetLimits",
    responses=_errors(401, 404, 422),
)
async def get_limits(tenant: TenantPath, engine: Engine, settings: Config) -> TenantLimits:
    return TenantLimits.of(await quotas.get_limits(engine, settings, tenant))


@router.patch(
    "/tenants/{tenant}/limits",
    operation_id="adminSetLimits",
    responses=_errors(400, 401, 404, 413, 422),
)
async def set_limits(
    tenant: TenantPath, body: LimitValues, engine: Engine, settings: Config, known: KnownKeys
) -> TenantLimits:
    """Set the limits the body names (null: back to the server's default); others stay."""
    changes = body.model_dump(exclude_unset=True)
    limits = await quotas.set_limits(engine, settings, tenant, changes)
    _forget(known)
    return TenantLimits.of(limits)


def _forget(known: KeyCache | None) -> None:
    """This process's cached keys, after a change to keys or limits that it made: the others
    hear of it from the database (app/services/key_cache.py)."""
    if known is not None:
        known.forget_all()


@router.get("/usage", operation_id="adminGetUsage", responses=_errors(401, 404, 422))
async def get_usage(
    engine: Engine,
    tenant: Annotated[
        str | None, Query(max_length=128, description="One tenant's (default: every tenant's).")
    ] = None,
    start: From = None,
    end: To = None,
) -> UsageReport:
    report = await quotas.usage_report(
        engine, tenant=tenant, start=parse_day(start, "from"), end=parse_day(end, "to")
    )
    return UsageReport.of(report)
