"""What a database outage looks like: the errors that mean "Postgres cannot be reached now".

A stopped, restarting or crashed server, a lost connection or an exhausted pool: nothing is
wrong with the request, and the same request may succeed in a moment. The API answers these 503
with Retry-After (app.api.errors); the event hub and the worker retry through them
(app.eventlog.hub, app.worker.run). Anything else, a constraint or a bug, is not an outage.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import TypeVar

import asyncpg
from sqlalchemy import exc as sa

# SQLSTATEs of an unreachable server: class 08 (connection exception), an administrator or a
# crash shutting it down or it starting up (57P01, 57P02, 57P03), no connection slot (53300).
_SQLSTATES = ("08", "57P01", "57P02", "57P03", "53300")
_DRIVERS = ("asyncpg.", "sqlalchemy.")
log = logging.getLogger(__name__)
T = TypeVar("T")


def database_unavailable(error: BaseException) -> bool:
    """Whether `error` (or what caused it) says the database cannot be reached now."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if _is_outage(current):
            return True
        if isinstance(current, BaseExceptionGroup):  # from a task group
            return any(database_unavailable(e) for e in current.exceptions)
        orig = getattr(current, "orig", None)
        current = (
            orig if isinstance(orig, BaseException) else (current.__cause__ or current.__context__)
        )
    return False


def _is_outage(error: BaseException) -> bool:
    if isinstance(error, sa.DBAPIError) and error.connection_invalidated:
        return True  # SQLAlchemy saw the connection die (and invalidated the pool)
    if isinstance(error, sa.DisconnectionError | sa.TimeoutError):
        return True  # a connection that failed its checkout; no pooled connection in time
    if isinstance(error, asyncpg.exceptions.ConnectionDoesNotExistError):
        return True
    if isinstance(error, asyncpg.exceptions.InterfaceError) and "connection is closed" in str(
        error
    ):
        return True
    sqlstate = getattr(error, "sqlstate", None)
    if isinstance(sqlstate, str) and sqlstate.startswith(_SQLSTATES):
        return True
    # Connecting: the driver lets the socket's own error through (refused, reset, no such
    # Unix socket, timed out). Only one raised inside the driver counts.
    return isinstance(error, OSError) and _raised_in_driver(error.__traceback__)


def _raised_in_driver(traceback: TracebackType | None) -> bool:
    while traceback is not None:
        module = traceback.tb_frame.f_globals.get("__name__", "")
        if isinstance(module, str) and module.startswith(_DRIVERS):
            return True
        traceback = traceback.tb_next
    return False


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
            if not database_unavailable(exc) or (deadline is not None and loop.time() > deadline):
                raise
            log.warning("the database cannot be reached (%s); retrying in %.1f s", exc, delay)
        await asyncio.sleep(delay)
        delay = min(delay * 2, 2.0)
