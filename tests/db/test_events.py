"""Run events outlive their run only for the retention period; the journal stays."""

from __future__ import annotations

import uuid

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db import events as events_db
from app.services.keys import create_key, tenant_for_key
from app.services.sessions import create_session


async def run_with_events(engine: AsyncEngine, ended_ago: str | None) -> str:
    tenant = await tenant_for_key(engine, await create_key(engine, f"ev-{uuid.uuid4()}"))
    assert tenant is not None
    session = await create_session(engine, tenant, title=None, metadata={}, config={})
    run_id = str(uuid.uuid4())
    async with engine.begin() as conn:
        ended = f"now() - interval '{ended_ago}'" if ended_ago else "NULL"
        await conn.execute(
            text(
                "INSERT INTO runs (id, tenant_id, session_id, model, status, ended_at)"
                f" VALUES (:id, :tenant, :session, 'openai:x', 'completed', {ended})"
            ),
            {"id": run_id, "tenant": tenant, "session": session["id"]},
        )
        await events_db.insert_events(
            conn,
            [
                {"run_id": run_id, "seq": i, "type": "message.delta", "data": {"text": "x"}}
                for i in (1, 2)
            ],
        )
    return run_id


async def test_prune_drops_only_events_of_runs_ended_before_the_retention(
    engine: AsyncEngine,
) -> None:
    old = await run_with_events(engine, "2 hours")
    recent = await run_with_events(engine, "10 minutes")
    running = await run_with_events(engine, None)
    async with engine.begin() as conn:
        assert await events_db.prune(conn, 3600) >= 2
    async with engine.connect() as conn:
        assert await events_db.last_seq(conn, old) == 0
        assert await events_db.last_seq(conn, recent) == 2
        assert await events_db.last_seq(conn, running) == 2
