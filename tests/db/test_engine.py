"""The engine's pool: a checkout is tested with one round trip, and a dead connection is
still replaced (the database restart tests pin the rest)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import text

from app.config import Settings
from app.db.engine import create_engine


async def test_a_checkout_pings_with_one_statement_and_no_transaction(
    settings: Settings,
) -> None:
    engine = create_engine(settings.model_copy(update={"db_pool_size": 1}))
    seen: list[str] = []
    try:
        async with engine.connect() as conn:
            raw: Any = (await conn.get_raw_connection()).driver_connection
            raw.add_query_logger(lambda record: seen.append(record.query))
        seen.clear()
        async with engine.connect() as conn:  # the same pooled connection, pinged
            await conn.execute(text("SELECT 1"))
        # The ping alone (no BEGIN and ROLLBACK around it), then the statement's transaction.
        assert [q.strip().upper() for q in seen[:2]] == ["SELECT 1", "BEGIN;"]
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
        async with killer.connect() as other:
            await other.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        async with engine.connect() as conn:  # its ping fails: a new connection instead
            assert (await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one() != pid
    finally:
        await engine.dispose()
        await killer.dispose()
