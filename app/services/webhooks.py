"""Completion webhooks: register, list and delete endpoints, read the delivery log, and queue
the deliveries of a run that ended (in the transaction that ends it)."""

from __future__ import annotations

import base64
import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal
from urllib.parse import urlsplit

from sqlalchemy import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.core.runs import Run
from app.core.webhook_signing import SECRET_PREFIX
from app.credentials import Vault
from app.db import jobs as jobs_db
from app.db import sessions as sessions_db
from app.db import webhooks as webhooks_db
from app.eventlog.registry import EventType, TerminalEvent
from app.services.cursors import decode_cursor, encode_cursor
from app.services.errors import Invalid, NotFound, session_not_found

# The events an endpoint can be told of: a run's end, and a run waiting for client tools.
WebhookEventType = Literal[TerminalEvent, EventType.RUN_REQUIRES_ACTION]


def webhook_not_found(endpoint_id: str) -> NotFound:
    return NotFound("webhook_not_found", f"no webhook {endpoint_id}", {"webhook_id": endpoint_id})


def check_url(url: str) -> None:
    """Only absolute http(s) URLs. Private and loopback addresses are allowed: a self-hosted
    service's receivers often live next to it."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
        parts.port  # noqa: B018 - raises on a port that is no number
    except ValueError as exc:
        raise Invalid("invalid_url", f"{url!r} is not a URL", {"loc": ["body", "url"]}) from exc
    if parts.scheme not in ("http", "https") or not host:
        raise Invalid(
            "invalid_url",
            "a webhook URL must be an absolute http:// or https:// URL",
            {"loc": ["body", "url"], "url": url},
        )


async def register(
    engine: AsyncEngine,
    tenant_id: str,
    *,
    url: str,
    session_id: str | None,
    event_types: list[WebhookEventType] | None,
    vault: Vault,
) -> dict[str, Any]:
    """A new endpoint with a fresh signing secret: returned here in clear (`secret`), and by no
    later read; stored encrypted."""
    check_url(url)
    secret = SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()
    async with engine.begin() as conn:
        if (
            session_id is not None
            and await sessions_db.get_session(conn, tenant_id, session_id) is None
        ):
            raise session_not_found(session_id)
        row = await webhooks_db.insert_endpoint(
            conn,
            tenant_id=tenant_id,
            session_id=session_id,
            url=url,
            encrypted_secret=vault.encrypt(secret),
            event_types=sorted(set(event_types)) if event_types else None,
        )
    return {**row, "secret": secret}


async def reencrypt(engine: AsyncEngine, vault: Vault) -> int:
    """Encrypt every endpoint's signing secret again under the newest key; how many."""
    async with engine.begin() as conn:
        rows = await webhooks_db.all_secrets(conn)
        for row in rows:
            await webhooks_db.set_secret(conn, row["id"], vault.rotate(row["encrypted_secret"]))
    return len(rows)


async def list_endpoints(engine: AsyncEngine, tenant_id: str) -> list[RowMapping]:
    async with engine.connect() as conn:
        return await webhooks_db.list_endpoints(conn, tenant_id)


async def get_endpoint(engine: AsyncEngine, tenant_id: str, endpoint_id: str) -> RowMapping:
    async with engine.connect() as conn:
        row = await webhooks_db.get_endpoint(conn, tenant_id, endpoint_id)
    if row is None:
        raise webhook_not_found(endpoint_id)
    return row


async def delete_endpoint(engine: AsyncEngine, tenant_id: str, endpoint_id: str) -> None:
    """Its deliveries go with it; a delivery's job still queued finds nothing to send."""
    async with engine.begin() as conn:
        if not await webhooks_db.delete_endpoint(conn, tenant_id, endpoint_id):
            raise webhook_not_found(endpoint_id)


@dataclass(frozen=True)
class DeliveryPage:
    items: list[RowMapping]
    next_cursor: str | None


async def deliveries(
    engine: AsyncEngine, tenant_id: str, endpoint_id: str, limit: int, cursor: str | None
) -> DeliveryPage:
    """The endpoint's delivery log, newest first, a page at a time."""
    before = decode_cursor(cursor) if cursor else None
    async with engine.connect() as conn:
        if await webhooks_db.get_endpoint(conn, tenant_id, endpoint_id) is None:
            raise webhook_not_found(endpoint_id)
        rows = await webhooks_db.list_deliveries(conn, endpoint_id, limit + 1, before)
    more = len(rows) > limit
    rows = rows[:limit]
    last = encode_cursor(rows[-1]["created_at"], rows[-1]["id"]) if more else None
    return DeliveryPage(rows, last)


async def queue_run_event(
    conn: AsyncConnection,
    run: Run,
    event_type: WebhookEventType,
    extra: Mapping[str, Any] | None = None,
    *,
    endpoints: list[str] | None = None,
) -> None:
    """Queue `event_type` of `run` (its row as now written) to every endpoint that wants it
    (`endpoints`, when the caller read them already), inside the caller's transaction:
    committed with the run's new state, or not at all."""
    if endpoints is None:
        found = await webhooks_db.endpoints_for(conn, run.tenant_id, run.session_id, event_type)
        endpoints = [str(e["id"]) for e in found]
    if not endpoints:
        return
    body = json.dumps(
        {
            "type": event_type,
            "timestamp": datetime.now(UTC).isoformat(),
            "data": run_data(run) | dict(extra or {}),
        },
        separators=(",", ":"),
    )
    ids = await webhooks_db.insert_deliveries(conn, endpoints, run.id, event_type, body)
    await jobs_db.defer_webhook(conn, ids)


def run_data(run: Run) -> dict[str, Any]:
    return {
        "run_id": run.id,
        "session_id": run.session_id,
        "kind": run.kind.value,
        "status": run.status.value,
        "model": run.model,
        "finish_reason": run.finish_reason,
        "text": run.result,
        "error": run.error,
        "usage": {
            "input_tokens": run.input_tokens,
            "output_tokens": run.output_tokens,
            "cached_tokens": run.cached_tokens,
            "cache_write_tokens": run.cache_write_tokens,
            "cost_usd": float(run.cost_usd) if run.cost_usd is not None else None,
        },
        "metadata": run.params.metadata,
    }
