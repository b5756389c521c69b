"""Tenant, API-key, limit and usage queries."""

from __future__ import annotations

from datetime import date
from typing import Any

from sqlalchemy import RowMapping, bindparam, func, select, text, update
from sqlalchemy.dialects.postgresql import Insert, insert
from sqlalchemy.ext.asyncio import AsyncConnection

from app.db.tables import (
    LIMIT_COLUMNS,
    USAGE_COUNTS,
    api_keys,
    runs,
    sessions,
    tenant_limits,
    tenant_usage,
    tenants,
)

ACTIVE_RUN_STATUSES = ("queued", "running", "requires_action", "awaiting_approval")


async def ensure_tenant(conn: AsyncConnection, name: str) -> str:
    """The id of the tenant called `name`, created if it does not exist yet."""
    await conn.execute(insert(tenants).values(name=name).on_conflict_do_nothing())
    tenant_id = await conn.scalar(select(tenants.c.id).where(tenants.c.name == name))
    assert tenant_id is not None
    return str(tenant_id)


async def tenant_by_name(conn: AsyncConnection, name: str) -> RowMapping | None:
    return (await conn.execute(select(tenants).where(tenants.c.name == name))).mappings().first()


async def list_tenants(conn: AsyncConnection) -> list[RowMapping]:
    active_keys = (
        select(func.count())
        .where(api_keys.c.tenant_id == tenants.c.id, _live_key())
        .scalar_subquery()
    )
    query = select(tenants, active_keys.label("active_keys")).order_by(tenants.c.name)
    return list((await conn.execute(query)).mappings())


def _live_key() -> Any:
    return (api_keys.c.revoked_at.is_(None)) | (api_keys.c.revoked_at > func.now())


async def insert_key(
    conn: AsyncConnection,
    tenant_id: str,
    key_hash: str,
    prefix: str,
    name: str | None,
    read_only: bool = False,
) -> RowMapping:
    query = (
        api_keys.insert()
        .values(
            tenant_id=tenant_id, key_hash=key_hash, prefix=prefix, name=name, read_only=read_only
        )
        .returning(api_keys.c.id)
    )
    key_id = (await conn.execute(query)).scalar_one()
    found = await get_key(conn, str(key_id))
    assert found is not None
    return found


def _key_rows() -> Any:
    return select(
        api_keys.c.id,
        api_keys.c.prefix,
        api_keys.c.name,
        api_keys.c.read_only,
        api_keys.c.created_at,
        api_keys.c.last_used_at,
        api_keys.c.revoked_at,
        api_keys.c.tenant_id,
        tenants.c.name.label("tenant"),
    ).join(tenants, tenants.c.id == api_keys.c.tenant_id)


async def get_key(conn: AsyncConnection, key_id: str, *, lock: bool = False) -> RowMapping | None:
    query = _key_rows().where(api_keys.c.id == key_id)
    if lock:
        query = query.with_for_update(of=api_keys)
    return (await conn.execute(query)).mappings().first()


async def list_keys(conn: AsyncConnection, tenant_id: str | None) -> list[RowMapping]:
    query = _key_rows().order_by(tenants.c.name, api_keys.c.created_at, api_keys.c.id)
    if tenant_id is not None:
        query = query.where(api_keys.c.tenant_id == tenant_id)
    return list((await conn.execute(query)).mappings())


async def keys_matching(conn: AsyncConnection, prefix: str, key_hash: str) -> list[RowMapping]:
    """Keys whose prefix is `prefix`, or whose hash is `key_hash` (the whole key was given)."""
    query = _key_rows().where((api_keys.c.prefix == prefix) | (api_keys.c.key_hash == key_hash))
    return list((await conn.execute(query)).mappings())


async def revoke_key(conn: AsyncConnection, key_id: str, after_seconds: float = 0) -> RowMapping:
    """Revoked now, or at the end of a grace period; an earlier revocation stands."""
    at = func.now() + text(f"make_interval(secs => {float(after_seconds)!r})")
    await conn.execute(
        update(api_keys)
        .where(api_keys.c.id == key_id)
        .values(revoked_at=func.least(func.coalesce(api_keys.c.revoked_at, at), at))
    )
    found = await get_key(conn, key_id)
    assert found is not None
    return found


async def tenant_for_key_hash(conn: AsyncConnection, key_hash: str) -> str | None:
    tenant_id = await conn.scalar(
        select(api_keys.c.tenant_id).where(api_keys.c.key_hash == key_hash, _live_key())
    )
    return str(tenant_id) if tenant_id is not None else None


# The key lookup of every request, in one statement: the live key's tenant and scope, the
# tenant's own limits (NULL: the server's default; an ask's quota check uses them), its last
# use (written at most once a minute), and, where the tenant has a requests-per-minute limit,
# the request counted in the tenant's current minute. Windows only move forward: a
# statement that started just before a minute's end but reaches the row after a newer one has
# counted into the newer window.
AUTHENTICATE = text(
    """
    WITH key AS (
        SELECT k.id, k.tenant_id, k.read_only, k.revoked_at,
               coalesce(l.requests_per_minute, CAST(:default_rpm AS bigint)) AS rpm,
               l.requests_per_minute, l.concurrent_runs, l.input_tokens_per_day,
               l.output_tokens_per_day, l.max_sessions
        FROM api_keys k LEFT JOIN tenant_limits l ON l.tenant_id = k.tenant_id
        WHERE k.key_hash = :key_hash AND (k.revoked_at IS NULL OR k.revoked_at > now())
    ), touched AS (
        UPDATE api_keys SET last_used_at = now() FROM key
        WHERE api_keys.id = key.id
          AND (api_keys.last_used_at IS NULL OR api_keys.last_used_at < now() - interval '1 minute')
    ), counted AS (
        INSERT INTO tenant_request_counts AS c (tenant_id, window_start, count)
        SELECT tenant_id, date_trunc('minute', now()), 1 FROM key WHERE rpm IS NOT NULL
        ON CONFLICT (tenant_id) DO UPDATE SET
            count = CASE WHEN excluded.window_start > c.window_start THEN 1 ELSE c.count + 1 END,
            window_start = greatest(c.window_start, excluded.window_start)
        RETURNING count, window_start
    )
    SELECT key.tenant_id, key.read_only, key.revoked_at, key.rpm, counted.count,
           counted.window_start,
           key.requests_per_minute, key.concurrent_runs, key.input_tokens_per_day,
           key.output_tokens_per_day, key.max_sessions,
           greatest(1, ceil(extract(epoch FROM counted.window_start + interval '1 minute'
                                              - clock_timestamp())))::int AS retry_after
    FROM key LEFT JOIN counted ON true
    """
)


async def authenticate(
    conn: AsyncConnection, key_hash: str, default_rpm: int | None
) -> RowMapping | None:
    result = await conn.execute(AUTHENTICATE, {"key_hash": key_hash, "default_rpm": default_rpm})
    return result.mappings().first()


# A request of a tenant whose key is known (app/services/key_cache.py), counted: AUTHENTICATE's
# count alone.
COUNT_REQUEST = text(
    """
    INSERT INTO tenant_request_counts AS c (tenant_id, window_start, count)
    VALUES (:tenant_id, date_trunc('minute', now()), 1)
    ON CONFLICT (tenant_id) DO UPDATE SET
        count = CASE WHEN excluded.window_start > c.window_start THEN 1 ELSE c.count + 1 END,
        window_start = greatest(c.window_start, excluded.window_start)
    RETURNING count, window_start,
              greatest(1, ceil(extract(epoch FROM window_start + interval '1 minute'
                                                 - clock_timestamp())))::int AS retry_after
    """
)


async def count_request(conn: AsyncConnection, tenant_id: str) -> RowMapping:
    return (await conn.execute(COUNT_REQUEST, {"tenant_id": tenant_id})).mappings().one()


async def get_limits(conn: AsyncConnection, tenant_id: str) -> RowMapping | None:
    query = select(tenant_limits).where(tenant_limits.c.tenant_id == tenant_id)
    return (await conn.execute(query)).mappings().first()


async def set_limits(conn: AsyncConnection, tenant_id: str, values: dict[str, int | None]) -> None:
    """Set the given limits (None: back to the server's default); the others stay."""
    assert set(values) <= set(LIMIT_COLUMNS)
    await conn.execute(
        insert(tenant_limits)
        .values(tenant_id=tenant_id, **values)
        .on_conflict_do_update(
            index_elements=[tenant_limits.c.tenant_id], set_={**values, "updated_at": func.now()}
        )
    )


async def lock_tenant(conn: AsyncConnection, tenant_id: str) -> None:
    """Serialize the quota checks of one tenant until the transaction ends. NO KEY UPDATE: the
    foreign keys of rows inserted meanwhile (sessions, runs) do not wait for it."""
    await conn.execute(
        select(tenants.c.id).where(tenants.c.id == tenant_id).with_for_update(key_share=True)
    )


async def count_active_runs(conn: AsyncConnection, tenant_id: str) -> int:
    query = select(func.count()).where(
        runs.c.tenant_id == tenant_id, runs.c.status.in_(ACTIVE_RUN_STATUSES)
    )
    return int((await conn.execute(query)).scalar_one())


async def count_sessions(conn: AsyncConnection, tenant_id: str) -> int:
    query = select(func.count()).where(sessions.c.tenant_id == tenant_id)
    return int((await conn.execute(query)).scalar_one())


async def tokens_today(conn: AsyncConnection, tenant_id: str) -> tuple[int, int]:
    """Input and output tokens of the tenant's runs that ended today (UTC)."""
    query = select(
        func.coalesce(func.sum(tenant_usage.c.input_tokens), 0),
        func.coalesce(func.sum(tenant_usage.c.output_tokens), 0),
    ).where(
        tenant_usage.c.tenant_id == tenant_id,
        tenant_usage.c.day == text("(now() AT TIME ZONE 'UTC')::date"),
    )
    row = (await conn.execute(query)).one()
    return int(row[0]), int(row[1])


_USAGE_COLUMNS = (*USAGE_COUNTS, "unpriced_runs", "cost_usd")


def _usage_added() -> Insert:
    statement = insert(tenant_usage).values(
        tenant_id=bindparam("usage_tenant"),
        day=text("(now() AT TIME ZONE 'UTC')::date"),
        model=bindparam("usage_model"),
        **{name: bindparam(f"usage_{name}") for name in _USAGE_COLUMNS},
    )
    return statement.on_conflict_do_update(
        index_elements=[tenant_usage.c.tenant_id, tenant_usage.c.day, tenant_usage.c.model],
        set_={name: tenant_usage.c[name] + statement.excluded[name] for name in _USAGE_COLUMNS},
    )


# The statement that counts one ended run's usage into today's (UTC) row of its tenant and
# model (run with the run's end: app/db/runs.end_run), its values bound from usage_added.
# Built once: constructing it cost more CPU than running it.
USAGE_ADDED = _usage_added()


def usage_added(
    tenant_id: str,
    model: str,
    *,
    input_tokens: int,
    output_tokens: int,
    cached_tokens: int,
    cache_write_tokens: int,
    reasoning_tokens: int = 0,
    cost_usd: Any,
) -> dict[str, Any]:
    """USAGE_ADDED's values for one ended run."""
    return {
        "usage_tenant": tenant_id,
        "usage_model": model,
        "usage_runs": 1,
        "usage_input_tokens": input_tokens,
        "usage_output_tokens": output_tokens,
        "usage_cached_tokens": cached_tokens,
        "usage_cache_write_tokens": cache_write_tokens,
        "usage_reasoning_tokens": reasoning_tokens,
        "usage_unpriced_runs": 1 if cost_usd is None else 0,
        "usage_cost_usd": cost_usd or 0,
    }


async def usage_rows(
    conn: AsyncConnection, tenant_id: str | None, start: date, end: date
) -> list[RowMapping]:
    """Usage per day and model (and tenant) from `start` to `end`, both included."""
    query = (
        select(tenant_usage, tenants.c.name.label("tenant"))
        .join(tenants, tenants.c.id == tenant_usage.c.tenant_id)
        .where(tenant_usage.c.day >= start, tenant_usage.c.day <= end)
        .order_by(tenant_usage.c.day, tenants.c.name, tenant_usage.c.model)
    )
    if tenant_id is not None:
        query = query.where(tenant_usage.c.tenant_id == tenant_id)
    return list((await conn.execute(query)).mappings())


async def set_session_ttl(conn: AsyncConnection, tenant_id: str, ttl_seconds: int | None) -> None:
    await conn.execute(
        update(tenants).where(tenants.c.id == tenant_id).values(session_ttl_seconds=ttl_seconds)
    )
