"""The engine's pool: a checkout is tested without a round trip, and a connection the server
closed is still replaced (the database restart tests pin the rest)."""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy import text

from app.config import Settings
from app.db.engine import create_engine


async def test_a_checkout_sends_nothing_before_the_statement(
    settings: Settings,
) -> None:
    engine = create_engine(settings.model_copy(update={"db_pool_size": 1}))
    seen: list[str] = []
    try:
        async with engine.connect() as conn:
            raw: Any = (await conn.get_raw_connection()).driver_connection
            raw.add_query_logger(lambda record: seen.append(record.query))
        seen.clear()
        async with engine.connect() as conn:  # the same pooled connection, checked locally
            await conn.execute(text("SELECT 2"))
        # No ping: what reaches the server first is the statement's transaction.
        assert [q.strip().upper() for q in seen[:1]] == ["BEGIN;"]
        assert "SELECT 1" not in [q.strip().upper() for q in seen]
    finally:
        await engine.dispose()


async def test_a_connection_that_died_in_the_pool_is_replaced_at_checkout(
    settings: Settings,
) -> None:
    engine = create_engine(settings.model_copy(update={"db_pool_size": 1}))
    killer = create_engine(settings.model_copy(update={"db_pool_size": 1}))
    try:
        async with engine.connect() as conn:
            pid = (await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one()
            raw: Any = (await conn.get_raw_connection()).driver_connection
        async with killer.connect() as other:
            await other.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        for _ in range(10_000):  # until the event loop has read the server closing it
            if raw.is_closed():
                break
            await asyncio.sleep(0.01)
        async with engine.connect() as conn:  # found closed: a new connection instead
            assert (await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one() != pid
    finally:
        await engine.dispose()
        await killer.dispose()
