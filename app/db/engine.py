"""The async engine: one pool per process."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from app.config import Settings


def create_engine(settings: Settings) -> AsyncEngine:
    # pool_pre_ping: a pooled connection is tested (one round trip) when it is checked out, and
    # replaced if it died. After a database restart, every pooled connection is dead: without
    # the ping, the first use of each one fails the request (or the run step) that drew it.
    return create_async_engine(
        settings.sqlalchemy_url,
        pool_size=settings.db_pool_size,
        max_overflow=settings.db_pool_size,
        pool_recycle=1800,
        pool_pre_ping=True,
    )


@asynccontextmanager
async def read_snapshot(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """A read-only transaction on one snapshot: a session row and the entries read after it
    agree, even while a concurrent delete moves an ancestor's range into a fork."""
    async with engine.connect() as conn:
        await conn.execution_options(isolation_level="REPEATABLE READ")
        async with conn.begin():
            yield conn
