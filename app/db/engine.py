"""The async engine: one pool per process."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any

from sqlalchemy import util
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from app.config import Settings


def create_engine(settings: Settings) -> AsyncEngine:
    # pool_pre_ping: a pooled connection is tested (one round trip) when it is checked out, and
    # replaced if it died. After a database restart, every pooled connection is dead: without
    # the ping, the first use of each one fails the request (or the run step) that drew it.
    engine = create_async_engine(
        settings.sqlalchemy_url,
        pool_size=settings.db_pool_size,
        max_overflow=settings.db_pool_size,
        pool_recycle=1800,
        pool_pre_ping=True,
    )
    engine.dialect.do_ping = _ping  # type: ignore[method-assign]
    return engine


_await: Callable[[Coroutine[Any, Any, Any]], Any] = util.await_only  # in 2.0 and 2.1


def _ping(dbapi_connection: Any) -> bool:
    """The pre-ping in one round trip. The asyncpg dialect's own wraps it in BEGIN and
    ROLLBACK (for pgbouncer's transaction mode, which Threadline cannot use anyway: it holds
    session advisory locks and LISTENs): three round trips on every checkout, which were a
    quarter of the database work of a streaming process."""
    try:
        _await(dbapi_connection._connection.fetchrow(";"))
    except Exception as error:
        dbapi_connection._handle_exception(error)  # raised as the DBAPI error, as the dialect's
    return True


@asynccontextmanager
async def read_snapshot(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """A read-only transaction on one snapshot: a session row and the entries read after it
    agree, even while a concurrent delete moves an ancestor's range into a fork."""
    async with engine.connect() as conn:
        await conn.execution_options(isolation_level="REPEATABLE READ")
        async with conn.begin():
            yield conn
