"""A worker process's lease: a session-level advisory lock held on a connection of its own.

Postgres releases the lock the moment the process dies (its connection closes), so another
worker sees within a tick that the runs of this lease have nobody left to finish them; a worker
that is merely slow (a long tool call, a pause) keeps its lock and its runs. If the connection
drops while the process lives (a database restart), the lease is taken again under the same key.
"""

from __future__ import annotations

import asyncio
import logging
import secrets

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

log = logging.getLogger(__name__)
# Lease keys are positive int8 values above 2**32: never the small keys other code may lock.
_LOW = 2**32


class WorkerLease:
    def __init__(self, engine: AsyncEngine, check_seconds: float = 0.5) -> None:
        self.key = _LOW + secrets.randbelow(2**62 - _LOW)
        self._engine = engine
        self._check = check_seconds
        self._conn: AsyncConnection | None = None

    async def acquire(self) -> None:
        conn = await self._engine.connect()
        try:
            await conn.execute(text("SELECT pg_advisory_lock(:key)"), {"key": self.key})
            await conn.commit()
        except BaseException:
            await conn.close()
            raise
        self._conn = conn

    async def keep(self) -> None:
        """Check the lease's connection every tick; take the lock again after it dropped."""
        while True:
            await asyncio.sleep(self._check)
            try:
                if self._conn is None:
                    await self.acquire()
                    log.warning("worker lease %s taken again", self.key)
                    continue
                await self._conn.execute(text("SELECT 1"))
                await self._conn.commit()
            except Exception:
                log.warning("worker lease %s lost its connection; retaking it", self.key)
                await self._drop()

    async def release(self) -> None:
        if self._conn is not None:
            try:
                await self._conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": self.key})
                await self._conn.commit()
            except Exception:
                pass  # the connection is gone: so is the lock
        await self._drop()

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                await conn.invalidate()
                await conn.close()
            except Exception:
                log.debug("closing the lease connection failed", exc_info=True)
