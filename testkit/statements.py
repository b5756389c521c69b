"""The statements an engine runs, watched: for tests of how many round trips a path takes."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from app.config import Settings
from app.db.engine import create_engine


@dataclass
class Seen:
    statements: list[str] = field(default_factory=list)
    in_transaction: list[bool] = field(default_factory=list)  # each statement's: not autocommit


@contextlib.contextmanager
def watching(engine: AsyncEngine) -> Iterator[Seen]:
    """The statements `engine` (the test's own: nothing else uses it) runs, and whether each
    ran in a transaction (BEGIN and COMMIT: two more round trips) or on its own."""
    seen = Seen()

    def statement(conn: Any, cursor: Any, sql: str, *args: Any) -> None:
        seen.statements.append(sql)
        level = conn.get_execution_options().get("isolation_level")
        seen.in_transaction.append(level != "AUTOCOMMIT")

    event.listen(engine.sync_engine, "before_cursor_execute", statement)
    try:
        yield seen
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", statement)


@contextlib.asynccontextmanager
async def own_engine(settings: Settings) -> AsyncIterator[AsyncEngine]:
    """An engine of the test's own (its statements are the test's alone)."""
    engine = create_engine(settings)
    try:
        yield engine
    finally:
        await engine.dispose()
