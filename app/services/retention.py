"""Retention: purge expired sessions (as DELETE would, forks kept whole) and old run events."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncEngine

from app.db import jobs as jobs_db
from app.db import sessions as sessions_db
from app.db import tenants as tenants_db
from app.eventlog import store as event_store
from app.services.sessions import delete_locked

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Purged:
    sessions: int
    run_events: int


async def purge_expired_sessions(
    engine: AsyncEngine, *, batch_size: int, now: datetime | None = None
) -> int:
    """Delete every session expired at `now` (default: the database's clock); returns how many.

    Each session goes in a transaction of its own, locked as DELETE locks it (its row, then the
    forks reading from it): a batch never holds many locks, and never deadlocks with a fork or
    a delete. A session whose expiry was pushed back meanwhile is left alone."""
    purged = 0
    while True:
        async with engine.connect() as conn:
            batch = await sessions_db.expired_session_ids(conn, now, batch_size)
        for session_id in batch:
            async with engine.begin() as conn:
                if not await sessions_db.lock_expired(conn, session_id, now):
                    continue
                await delete_locked(conn, session_id)
                purged += 1
        if len(batch) < batch_size:
            return purged


async def purge(
    engine: AsyncEngine,
    *,
    event_retention_seconds: float,
    batch_size: int,
    now: datetime | None = None,
) -> Purged:
    """The retention job: expired sessions; then the events of runs ended longer ago than
    `event_retention_seconds` (the journal keeps what they said) with their finished jobs and
    those of their webhook deliveries, `batch_size` runs a transaction; the jobs of purged runs
    that a worker held while they were purged; and the finished maintenance jobs."""
    sessions = await purge_expired_sessions(engine, batch_size=batch_size, now=now)
    events = 0
    while True:
        async with engine.begin() as conn:
            pruned = await event_store.prune(conn, event_retention_seconds, now, batch_size)
            await jobs_db.delete_jobs_of_runs(conn, pruned.run_ids, finished_only=True)
        events += pruned.events
        if len(pruned.run_ids) < batch_size:
            break
    async with engine.begin() as conn:
        await jobs_db.delete_orphaned_jobs(conn)
        await jobs_db.delete_finished_maintenance_jobs(conn)
    if sessions or events:
        log.info("retention: purged %d expired sessions and %d run events", sessions, events)
    return Purged(sessions, events)


async def set_session_ttl(engine: AsyncEngine, tenant: str, ttl_seconds: int | None) -> None:
    """The default TTL of the new sessions of the tenant called `tenant` (made if need be)."""
    async with engine.begin() as conn:
        tenant_id = await tenants_db.ensure_tenant(conn, tenant)
        await tenants_db.set_session_ttl(conn, tenant_id, ttl_seconds)
