"""Hot statements run by asyncpg itself: the rows and errors conn.execute would give, outside a
transaction only, heard by the engine's listeners, and a lost connection invalidated."""

from __future__ import annotations

import uuid
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import bindparam, column, select, text
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from app.config import Settings
from app.db import hot
from app.db import runs as runs_db
from app.db.engine import autocommit
from app.db.outage import database_unavailable
from app.db.tables import runs, sessions
from testkit.statements import own_engine, watching
from tests.db.test_runs import created, new_session, run_values

# A typed statement with an IN list rendered per execution (expanding), a JSONB parameter and
# columns whose results SQLAlchemy processes (UUIDs as str, a Decimal, a timestamp).
_RUNS_OF_SESSION = (
    select(runs.c.id, runs.c.session_id, runs.c.cost_usd, runs.c.created_at, runs.c.params)
    .where(
        runs.c.session_id == bindparam("session_id"),
        runs.c.status.in_(["queued", "running"]),
        runs.c.params.contains(bindparam("has", type_=runs.c.params.type)),
    )
    .order_by(runs.c.created_at)
)


async def both(
    engine: AsyncEngine, statement: Any, params: dict[str, Any]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The statement's rows by asyncpg itself, and by conn.execute."""
    async with autocommit(engine) as conn:
        assert hot.runs_here(conn)
        fast = await hot.fetch(conn, statement, params)
        slow = [dict(r) for r in (await conn.execute(statement, params)).mappings()]
    return fast, slow


async def a_run(engine: AsyncEngine) -> tuple[str, str, dict[str, Any]]:
    tenant, session_id = await new_session(engine)
    values = run_values(tenant, session_id)
    async with engine.begin() as conn:
        await runs_db.insert_queued_run(conn, created(values), **values)
    return tenant, session_id, values


async def test_its_rows_are_what_conn_execute_gives(engine: AsyncEngine) -> None:
    _, session_id, values = await a_run(engine)
    params = {"session_id": session_id, "has": {"metadata": {"k": "v"}}}
    fast, slow = await both(engine, _RUNS_OF_SESSION, params)
    assert fast == slow and len(fast) == 1
    (row,) = fast
    assert (row["id"], row["session_id"]) == (values["id"], session_id)  # str, as stored
    assert row["created_at"].tzinfo is not None and row["params"]["metadata"] == {"k": "v"}
    # An untyped text statement: the driver's names and values.
    statement = text("SELECT id, rev, 2.5 AS half FROM sessions WHERE id = :id")
    fast, slow = await both(engine, statement, {"id": session_id})
    assert fast[0]["half"] == Decimal("2.5")
    assert [{**r, "id": str(r["id"])} for r in fast] == [{**r, "id": str(r["id"])} for r in slow]
    # A statement typed by position (TextualSelect.columns).
    typed = text("SELECT id, title FROM sessions WHERE id = :id").columns(
        sessions.c.id, column("title")
    )
    fast, slow = await both(engine, typed, {"id": session_id})
    assert fast == slow and fast[0]["id"] == session_id


async def test_its_errors_are_sqlalchemys(engine: AsyncEngine) -> None:
    _, _, values = await a_run(engine)
    again = {**values, "id": str(uuid.uuid4()), "idempotency_key": "same"}
    async with autocommit(engine) as conn:
        await runs_db.insert_queued_run(conn, created(again), **again)
        twice = {**again, "id": str(uuid.uuid4())}
        with pytest.raises(IntegrityError) as refused:
            await runs_db.insert_queued_run(conn, created(twice), **twice)
        assert "runs_idempotency_key" in str(refused.value.orig)
        assert getattr(refused.value.orig, "sqlstate", None) == "23505"
        with pytest.raises(DBAPIError) as raised:
            await hot.fetch(conn, text("SELECT threadline_still_as_read(false)"), {})
        assert getattr(raised.value.orig, "sqlstate", None) == runs_db.CHANGED_SQLSTATE
        # The connection is still good for the next statement.
        assert await hot.fetch(conn, text("SELECT 1 AS one"), {}) == [{"one": 1}]


async def test_in_a_transaction_it_runs_in_the_transaction(engine: AsyncEngine) -> None:
    _, session_id, _ = await a_run(engine)
    renamed = text("UPDATE sessions SET title = 'renamed' WHERE id = :id RETURNING title")
    async with engine.connect() as conn:
        transaction = await conn.begin()
        assert not hot.runs_here(conn)
        assert await hot.fetch(conn, renamed, {"id": session_id}) == [{"title": "renamed"}]
        await transaction.rollback()
    async with engine.connect() as conn:
        title = await conn.scalar(
            text("SELECT title FROM sessions WHERE id = :id"), {"id": session_id}
        )
    assert title is None  # rolled back with it


async def test_the_engines_listeners_hear_it(settings: Settings) -> None:
    async with own_engine(settings) as engine:
        _, session_id, _ = await a_run(engine)
        statement = text("SELECT rev FROM sessions WHERE id = :id")
        with watching(engine) as seen:
            async with autocommit(engine) as conn:
                await hot.fetch(conn, statement, {"id": session_id})
        assert seen.statements == [str(statement.compile(dialect=engine.dialect))]
        assert seen.in_transaction == [False]


async def test_a_lost_connection_is_invalidated_and_counts_as_an_outage(
    settings: Settings,
) -> None:
    async with own_engine(settings) as engine:
        async with autocommit(engine) as conn:
            pid = (await hot.fetch(conn, text("SELECT pg_backend_pid() AS pid"), {}))[0]["pid"]
            async with engine.connect() as other:
                await other.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
            with pytest.raises(DBAPIError) as lost:
                await hot.fetch(conn, text("SELECT 1 AS one"), {})
            assert lost.value.connection_invalidated and database_unavailable(lost.value)
            assert conn.invalidated
        async with autocommit(engine) as conn:  # the pool gives a live one
            assert await hot.fetch(conn, text("SELECT 1 AS one"), {}) == [{"one": 1}]


async def test_an_in_list_the_caller_gives_is_rendered_for_each_call(engine: AsyncEngine) -> None:
    """A constant IN list is rendered once; one the caller gives may change length each call."""
    _, session_id, values = await a_run(engine)
    given = select(runs.c.id).where(
        runs.c.session_id == bindparam("session_id"),
        runs.c.status.in_(bindparam("statuses", expanding=True)),
    )
    for statuses, found in ((["queued"], 1), (["running", "failed", "queued"], 1), (["x"], 0)):
        params = {"session_id": session_id, "statuses": statuses}
        fast, slow = await both(engine, given, params)
        assert fast == slow and len(fast) == found
    having = {"session_id": session_id, "has": {"metadata": {"k": "v"}}}
    for _ in range(2):  # the constant list's second call runs its SQL as rendered at the first
        fast, slow = await both(engine, _RUNS_OF_SESSION, having)
        assert fast == slow and [r["id"] for r in fast] == [values["id"]]
