"""The async engine: one pool per process."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TypeVar

from sqlalchemy.exc import DBAPIError, InterfaceError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from app.config import Settings

log = logging.getLogger(__name__)
T = TypeVar("T")


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


def database_unreachable(exc: BaseException) -> bool:
    """Whether `exc` says the database could not be reached (down, restarting, connection
    dropped), rather than that a statement was wrong: worth retrying once it is back."""
    if isinstance(exc, DBAPIError):
        if exc.connection_invalidated:
            return True
        exc = exc.orig if exc.orig is not None else exc
    if isinstance(exc, OSError | ConnectionError | TimeoutError):
        return True
    # asyncpg's own: raised while the server shuts down, starts up, or drops the connection
    name = type(exc).__name__
    return name in _UNREACHABLE or (
        isinstance(exc, DBAPIError | InterfaceError) and "connection" in str(exc).lower()
    )


_UNREACHABLE = frozenset(
    {
        "ConnectionDoesNotExistError",
        "CannotConnectNowError",
        "AdminShutdownError",
        "CrashShutdownError",
        "ConnectionFailureError",
        "ConnectionRejectionError",
        "InterfaceError",
        "InternalClientError",
    }
)


async def retrying(attempt: Callable[[], Awaitable[T]], *, give_up_after: float | None = None) -> T:
    """Run `attempt` (a whole transaction) again while the database cannot be reached, with a
    backoff up to 2 s, for at most `give_up_after` seconds (None: until it is back)."""
    loop = asyncio.get_running_loop()
    deadline = None if give_up_after is None else loop.time() + give_up_after
    delay = 0.1
    while True:
        try:
            return await attempt()
        except Exception as exc:
            if not database_unreachable(exc) or (deadline is not None and loop.time() > deadline):
                raise
            log.warning("the database cannot be reached (%s); retrying in %.1f s", exc, delay)
        await asyncio.sleep(delay)
        delay = min(delay * 2, 2.0)
