"""Delivering completion webhooks: one job per delivery, each attempt logged on its row, a
failed attempt raised so that procrastinate retries the job with exponential backoff."""

from __future__ import annotations

import time

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from app.config import Settings
from app.core import webhook_signing
from app.credentials import vault_for
from app.db import webhooks as webhooks_db


class DeliveryFailed(Exception):
    """This attempt failed and there are attempts left: the job is retried later."""


async def deliver(engine: AsyncEngine, settings: Settings, delivery_id: str) -> str | None:
    """Send the delivery once, if it is still to be made; returns its status after the attempt
    (None: nothing to do: delivered, given up, deleted, or another worker is sending it).

    The row stays locked while the request is out, so a second worker given the same job never
    sends it at the same time; a worker dying mid-request leaves it pending (at least once)."""
    async with engine.begin() as conn:
        row = await webhooks_db.pending_delivery(conn, delivery_id)
        if row is None:
            return None
        timestamp = int(time.time())
        secret = vault_for(settings).decrypt(row["encrypted_secret"])
        headers = webhook_signing.headers(secret, str(row["id"]), timestamp, row["body"])
        headers |= {"content-type": "application/json", "user-agent": "threadline-webhooks"}
        status_code: int | None = None
        error: str | None = None
        try:
            async with httpx.AsyncClient(timeout=settings.run_webhook_timeout_seconds) as client:
                response = await client.post(row["url"], content=row["body"], headers=headers)
            status_code = response.status_code
            if not 200 <= status_code < 300:
                error = f"the receiver answered {status_code}: {response.text[:500]}"
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}"[:500]
        final = int(row["attempts"]) + 1 >= settings.run_webhook_max_attempts
        status = "delivered" if error is None else "failed" if final else "pending"
        await webhooks_db.record_attempt(
            conn, delivery_id, status=status, status_code=status_code, error=error
        )
    if status == "pending":
        raise DeliveryFailed(error)
    return status
