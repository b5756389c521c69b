"""Completion webhook queries: endpoints (per tenant or per session) and their delivery log."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    ColumnElement,
    RowMapping,
    and_,
    bindparam,
    func,
    literal,
    or_,
    select,
    tuple_,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection

from app.db.tables import webhook_deliveries, webhook_endpoints


async def insert_endpoint(conn: AsyncConnection, **values: Any) -> RowMapping:
    query = webhook_endpoints.insert().values(**values).returning(webhook_endpoints)
    row: RowMapping = (await conn.execute(query)).mappings().one()
    return row


async def all_secrets(conn: AsyncConnection) -> list[RowMapping]:
    """Every endpoint's encrypted signing secret (for re-encryption under the newest key)."""
    query = select(webhook_endpoints.c.id, webhook_endpoints.c.encrypted_secret)
    return list((await conn.execute(query)).mappings())


async def set_secret(conn: AsyncConnection, endpoint_id: str, encrypted_secret: str) -> None:
    await conn.execute(
        webhook_endpoints.update()
        .where(webhook_endpoints.c.id == endpoint_id)
        .values(encrypted_secret=encrypted_secret)
    )


async def list_endpoints(conn: AsyncConnection, tenant_id: str) -> list[RowMapping]:
    query = (
        select(webhook_endpoints)
        .where(webhook_endpoints.c.tenant_id == tenant_id)
        .order_by(webhook_endpoints.c.created_at, webhook_endpoints.c.id)
    )
    return list((await conn.execute(query)).mappings())


async def get_endpoint(
    conn: AsyncConnection, tenant_id: str, endpoint_id: str
) -> RowMapping | None:
    query = select(webhook_endpoints).where(
        webhook_endpoints.c.id == endpoint_id, webhook_endpoints.c.tenant_id == tenant_id
    )
    return (await conn.execute(query)).mappings().one_or_none()


async def delete_endpoint(conn: AsyncConnection, tenant_id: str, endpoint_id: str) -> bool:
    query = webhook_endpoints.delete().where(
        webhook_endpoints.c.id == endpoint_id, webhook_endpoints.c.tenant_id == tenant_id
    )
    return bool((await conn.execute(query)).rowcount)


async def endpoints_for(
    conn: AsyncConnection, tenant_id: str, session_id: str, event_type: str
) -> list[RowMapping]:
    """The tenant's endpoints and the session's that want `event_type`."""
    query = select(webhook_endpoints.c.id).where(wanting(tenant_id, session_id, [event_type]))
    return list((await conn.execute(query)).mappings())


def wanting(tenant_id: Any, session_id: Any, event_type: Any) -> ColumnElement[bool]:
    """endpoints_for's condition on webhook_endpoints (the values, or bind parameters for a
    statement built once: WANTING)."""
    return and_(
        webhook_endpoints.c.tenant_id == tenant_id,
        or_(
            webhook_endpoints.c.session_id.is_(None),
            webhook_endpoints.c.session_id == session_id,
        ),
        or_(
            webhook_endpoints.c.event_types.is_(None),
            webhook_endpoints.c.event_types.contains(event_type),
        ),
    )


# wanting, for a statement that reads the endpoints along with other work (app/db/runs.end_run),
# its values bound from wanting_values.
WANTING = wanting(
    bindparam("want_tenant"),
    bindparam("want_session"),
    bindparam("want_event_types", type_=webhook_endpoints.c.event_types.type),
)


def wanting_values(tenant_id: str, session_id: str, event_type: str) -> dict[str, Any]:
    return {"want_tenant": tenant_id, "want_session": session_id, "want_event_types": [event_type]}


async def insert_deliveries(
    conn: AsyncConnection, endpoint_ids: list[str], run_id: str, event_type: str, body: str
) -> list[str]:
    if not endpoint_ids:
        return []
    query = webhook_deliveries.insert().returning(webhook_deliveries.c.id)
    rows = [
        {"endpoint_id": e, "run_id": run_id, "event_type": event_type, "body": body}
        for e in endpoint_ids
    ]
    return [str(i) for i in (await conn.execute(query, rows)).scalars()]


async def list_deliveries(
    conn: AsyncConnection, endpoint_id: str, limit: int, before: tuple[datetime, str] | None
) -> list[RowMapping]:
    """Newest first; `before` is the (created_at, id) keyset cursor of the previous page."""
    query = select(webhook_deliveries).where(webhook_deliveries.c.endpoint_id == endpoint_id)
    if before is not None:
        created_at, delivery_id = before
        cursor = tuple_(
            literal(created_at, webhook_deliveries.c.created_at.type),
            literal(delivery_id, webhook_deliveries.c.id.type),
        )
        query = query.where(
            tuple_(webhook_deliveries.c.created_at, webhook_deliveries.c.id) < cursor
        )
    query = query.order_by(
        webhook_deliveries.c.created_at.desc(), webhook_deliveries.c.id.desc()
    ).limit(limit)
    return list((await conn.execute(query)).mappings())


async def pending_delivery(conn: AsyncConnection, delivery_id: str) -> RowMapping | None:
    """A delivery still to be made, with its endpoint's URL and secret; locked, so that two
    workers given the same job (a stalled worker's, retried) never send it at once."""
    query = (
        select(
            webhook_deliveries.c.id,
            webhook_deliveries.c.body,
            webhook_deliveries.c.attempts,
            webhook_endpoints.c.url,
            webhook_endpoints.c.encrypted_secret,
        )
        .join(webhook_endpoints, webhook_endpoints.c.id == webhook_deliveries.c.endpoint_id)
        .where(webhook_deliveries.c.id == delivery_id, webhook_deliveries.c.status == "pending")
        .with_for_update(of=webhook_deliveries, skip_locked=True)
    )
    return (await conn.execute(query)).mappings().one_or_none()


async def record_attempt(
    conn: AsyncConnection,
    delivery_id: str,
    *,
    status: str,
    status_code: int | None,
    error: str | None,
) -> None:
    values: dict[str, Any] = {
        "status": status,
        "attempts": webhook_deliveries.c.attempts + 1,
        "last_status_code": status_code,
        "last_error": error,
        "last_attempt_at": func.now(),
    }
    if status == "delivered":
        values["delivered_at"] = func.now()
    await conn.execute(
        update(webhook_deliveries).where(webhook_deliveries.c.id == delivery_id).values(**values)
    )
