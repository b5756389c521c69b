"""Alembic environment: async engine, URL from the caller or from Settings."""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy import text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from app.config import Settings, to_asyncpg_url
from app.db.tables import metadata

# A small advisory lock key ("thln"): worker leases take keys above 2**32 (app/worker/lease.py).
MIGRATION_LOCK = 0x74686C6E
config = context.config
target_metadata = metadata


def _url() -> str:
    settings = Settings()
    url = config.get_main_option("sqlalchemy.url") or settings.direct_database_url
    url = url or settings.database_url
    if not url:
        raise RuntimeError("set THREADLINE_DATABASE_URL (or sqlalchemy.url) to migrate")
    return to_asyncpg_url(url)


def _run(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=target_metadata)
    with context.begin_transaction():
        # Processes starting together (API replicas, workers, `threadline migrate`) would each
        # apply the same migrations and all but one fail on duplicate tables. The first takes
        # this lock; the others wait for its commit, then read the version it left and find
        # nothing to do. Transaction-scoped: released at commit, also through a pooler.
        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})
        context.run_migrations()


async def _run_async() -> None:
    engine = create_async_engine(_url())
    async with engine.connect() as connection:
        await connection.run_sync(_run)
    await engine.dispose()


if context.is_offline_mode():
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    asyncio.run(_run_async())
