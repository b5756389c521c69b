"""History search: full-text search over a session's whole thread, fork lineage included."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import RowMapping
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db import journal as journal_db
from app.db import sessions as sessions_db
from app.db.engine import read_snapshot
from app.services.errors import session_not_found


async def search_history(
    engine: AsyncEngine,
    tenant_id: str,
    session_id: str,
    query: str,
    *,
    limit: int = 10,
    kinds: Sequence[str] | None = None,
) -> list[RowMapping]:
    """Ranked matches with excerpts, across everything the thread ever held: compaction takes
    entries out of the context, never out of the journal."""
    async with read_snapshot(engine) as conn:
        session = await sessions_db.get_session(conn, tenant_id, session_id)
        if session is None:
            raise session_not_found(session_id)
        thread = session.thread
        return await journal_db.search_entries(conn, thread, query, kinds=kinds, limit=limit)
