"""The async engine: one pool per process, and direct connections for what a pooler breaks."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from uuid import uuid4

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from app.config import Settings, to_asyncpg_url


def pool_limit(settings: Settings) -> int:
    """The most connections one engine opens: its pool, and as many again in overflow."""
    return 2 * settings.db_pool_size


# An engine option of ours: the database is reached through a transaction pooler.
BEHIND_POOLER = "threadline_behind_pooler"


def create_engine(settings: Settings) -> AsyncEngine:
    # pool_pre_ping with a ping that costs no round trip (_alive): a pooled connection whose
    # socket the server closed (a database restart, a pooler dropping idle clients) is
    # replaced at checkout, and the pool with it, instead of failing the request (or the run
    # step) that drew it. A SELECT 1 per checkout was a fifth of the statements of an ask.
    # Last in, first out: the few connections a steady load needs are the ones reused, each
    # with its statements prepared and its types known; a queue would cycle through the whole
    # pool, preparing every statement on every connection (and opening ones it never needed).
    engine = create_async_engine(
        settings.sqlalchemy_url,
        pool_size=settings.db_pool_size,
        max_overflow=pool_limit(settings) - settings.db_pool_size,
        pool_recycle=1800,
        pool_pre_ping=True,
        pool_use_lifo=True,
        connect_args=_statement_options(settings),
        execution_options={BEHIND_POOLER: not settings.db_prepared_statements},
    )
    engine.dialect.do_ping = _alive  # type: ignore[method-assign]
    return engine


def _alive(dbapi_connection: Any) -> bool:
    """Whether the connection is still open, as asyncpg knows without asking the server: the
    event loop reads the server's closing of an idle connection (its FATAL message, then end
    of stream) as it happens, and asyncpg marks the connection closed."""
    return not dbapi_connection._connection.is_closed()


def create_direct_engine(settings: Settings) -> AsyncEngine:
    """Unpooled connections to the database itself (direct_database_url): each is opened when
    taken and closed when given back. For a connection held for the life of the process, whose
    session state must stay its own (a session advisory lock)."""
    return create_async_engine(to_asyncpg_url(settings.direct_url), poolclass=NullPool)


def libpq_url(database_url: str) -> str:
    """The URL as libpq (psycopg, asyncpg.connect) takes it: plain postgresql://, without
    SQLAlchemy's driver suffix. procrastinate's connector and the event hub's LISTEN use it."""
    for prefix in ("postgresql+asyncpg://", "postgres://"):
        if database_url.startswith(prefix):
            return "postgresql://" + database_url[len(prefix) :]
    return database_url


def _statement_options(settings: Settings) -> dict[str, Any]:
    """Behind a transaction pooler, consecutive transactions of one client connection may run on
    different server connections: a statement prepared (and cached) on one is missing on the
    next, and two clients' statements of the same name collide on one. No cache, and names
    unique to each preparation (the recipe SQLAlchemy documents for PgBouncer)."""
    if settings.db_prepared_statements:
        return {}
    return {
        "statement_cache_size": 0,
        "prepared_statement_cache_size": 0,
        "prepared_statement_name_func": lambda: f"__asyncpg_{uuid4()}__",
    }


@asynccontextmanager
async def read_snapshot(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """A read-only transaction on one snapshot: a session row and the entries read after it
    agree, even while a concurrent delete moves an ancestor's range into a fork."""
    async with engine.connect() as conn:
        await conn.execution_options(isolation_level="REPEATABLE READ")
        async with conn.begin():
            yield conn


@asynccontextmanager
async def autocommit(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """A pooled connection without a transaction around its statements: for reads of one
    statement each, which then take one round trip instead of three (no BEGIN, no ROLLBACK).
    Each statement reads a fresh snapshot, as it would in a transaction of its own.

    Not behind a transaction pooler: outside a transaction it may run a statement's prepare
    and its execution on two different server connections ("prepared statement does not
    exist"); there the reads keep their transaction."""
    async with engine.connect() as conn:
        if not engine.get_execution_options().get(BEHIND_POOLER, False):
            await conn.execution_options(isolation_level="AUTOCOMMIT")
        yield conn
