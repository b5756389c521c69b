"""Row locks held, and waits for them watched: for tests of what waits for what (a run's end
behind an ask, the recovery beside one), with no reliance on timing."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.db.engine import autocommit

T = TypeVar("T")
DEADLINE_SECONDS = 60.0  # a safety net only: each wait ends on what Postgres reports


@contextlib.asynccontextmanager
async def holding_session(engine: AsyncEngine, session_id: str) -> AsyncIterator[AsyncConnection]:
    """A transaction holding the session's row as an ask does (FOR UPDATE), committed on
    leaving; yields its connection, for the test's writes as the ask."""
    async with engine.connect() as holder:
        await holder.begin()
        await holder.execute(
            text("SELECT id FROM sessions WHERE id = :id FOR UPDATE"), {"id": session_id}
        )
        yield holder
        await holder.commit()


async def waiting_for_a_lock(engine: AsyncEngine, task: asyncio.Task[object], like: str) -> None:
    """Until a statement matching `like` waits for a row lock (or `task` failed: say how)."""
    waiting = text(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE :like"
    )
    deadline = asyncio.get_running_loop().time() + DEADLINE_SECONDS
    while True:  # a statement of its own each time: pg_stat_activity is read once a transaction
        async with autocommit(engine) as watcher:
            if (await watcher.execute(waiting, {"like": like})).scalar():
                return
        if task.done():
            task.result()
        assert asyncio.get_running_loop().time() < deadline, "it never waited"
        await asyncio.sleep(0.01)


async def never_waiting_for(engine: AsyncEngine, holder: AsyncConnection, work: Awaitable[T]) -> T:
    """What `work` returns, having checked all along that it never waits for a lock `holder`
    holds (it fails the moment it does)."""
    pid = (await holder.execute(text("SELECT pg_backend_pid()"))).scalar_one()
    blocked = text("SELECT count(*) FROM pg_stat_activity WHERE :pid = ANY(pg_blocking_pids(pid))")
    task = asyncio.ensure_future(work)
    while not task.done():
        async with autocommit(engine) as watcher:
            waiting = (await watcher.execute(blocked, {"pid": pid})).scalar()
        if waiting:
            task.cancel()
            raise AssertionError("it waited for a lock the holder holds")
        await asyncio.sleep(0.01)
    return await task
