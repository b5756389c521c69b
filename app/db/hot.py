"""The hot path's statements, run by asyncpg itself: compiled once by SQLAlchemy.

An ask's read and commit, the event writer's ticks and a run's end run for every ask. For such
statements SQLAlchemy's execution (its compiled-cache lookup, parameter processing, execution
context, cursor and result objects) costs several times the driver's own work. Here each
statement is compiled once per dialect (its SQL, its parameters in position with their bind
processors, its columns with their result processors) and run on the connection's own asyncpg
connection, through the dialect's cache of prepared statements, under its lock. Its rows are
the values conn.execute's rows would hold; its errors are the ones conn.execute would raise (a
lost connection invalidates the pooled one, as SQLAlchemy does), and the engine's
before_cursor_execute listeners hear of it (with no cursor or execution context).

Only outside a transaction: on an autocommit connection (app/db/engine.autocommit) that is not
behind a transaction pooler. Anywhere else conn.execute runs the statement, in the caller's
transaction.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql import ClauseElement, Executable
from sqlalchemy.sql.compiler import SQLCompiler

from app.db.engine import BEHIND_POOLER

Processor = Callable[[Any], Any] | None


@dataclass
class _Compiled:
    statement: Executable  # held: its id keys the cache
    sql: str
    compiled: SQLCompiler  # its construct_params gives every parameter's value
    names: tuple[str, ...]  # the parameters in position
    binds: tuple[Processor, ...]
    keys: tuple[str, ...]  # the columns' names, in position
    types: tuple[Any, ...]  # the columns' SQLAlchemy types
    # It has parameters rendered into its SQL on each execution (an IN list: "expanding"),
    # some given by the caller; one whose IN lists are all constants (written in the
    # statement) is rendered at its first execution only, and `constants` is their values.
    expanding: bool
    constants: dict[str, Any] | None = None
    # The columns' result processors, made once the driver has said what it returns.
    results: tuple[Processor, ...] | None = None


_compiled: dict[tuple[int, int], _Compiled] = {}


def _compile(statement: Executable, dialect: Dialect) -> _Compiled:
    found = _compiled.get((id(statement), id(dialect)))
    if found is not None and found.statement is statement:
        return found
    compiled = cast(SQLCompiler, cast(ClauseElement, statement).compile(dialect=dialect))
    names = tuple(compiled.positiontup or ())
    processors: Mapping[str, Any] = compiled._bind_processors  # (no tuple-valued parameter here)
    columns = compiled._result_columns or []
    made = _Compiled(
        statement,
        compiled.string,
        compiled,
        names,
        tuple(processors.get(name) for name in names),
        tuple(c.keyname for c in columns),
        tuple(c.type for c in columns),
        bool(compiled.post_compile_params or compiled.literal_execute_params),
        None
        if compiled.literal_execute_params
        or not all(p.unique and p.callable is None for p in compiled.post_compile_params)
        else {},
    )
    _compiled[(id(statement), id(dialect))] = made
    return made


def runs_here(conn: AsyncConnection) -> bool:
    """Whether `conn` runs hot statements through asyncpg itself (not in a transaction)."""
    options = conn.sync_connection.get_execution_options() if conn.sync_connection else {}
    return options.get("isolation_level") == "AUTOCOMMIT" and not options.get(BEHIND_POOLER)


async def fetch(
    conn: AsyncConnection, statement: Executable, params: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """The rows `statement` answers with `params`, each as a mapping of its columns."""
    if not runs_here(conn):
        return [dict(r) for r in (await conn.execute(statement, params)).mappings()]
    dialect = conn.dialect
    compiled = _compile(statement, dialect)
    sql, args = _arguments(compiled, params)
    sync = conn.sync_connection
    if sync is not None and sync.dispatch.before_cursor_execute:
        # Its listeners hear of it, as of any statement (with no cursor or context).
        sync.dispatch.before_cursor_execute(sync, None, sql, args, None, False)
    raw = await conn.get_raw_connection()
    adapted: Any = raw.dbapi_connection
    try:
        async with adapted._execute_mutex:
            prepared, attributes = await adapted._prepare(
                sql,
                dialect._invalidate_schema_cache_asof,  # type: ignore[attr-defined]
            )
            records = await prepared.fetch(*args)
    except Exception as error:
        raise await _translated(conn, adapted, sql, args, error) from error
    results = compiled.results
    if results is None:
        results = compiled.results = _result_processors(compiled, attributes, dialect)
    keys = compiled.keys if len(compiled.keys) == len(attributes) else [a.name for a in attributes]
    return [
        {
            key: process(value) if process is not None else value
            for key, process, value in zip(keys, results, record, strict=True)
        }
        for record in records
    ]


async def fetch_one_or_none(
    conn: AsyncConnection, statement: Executable, params: Mapping[str, Any]
) -> dict[str, Any] | None:
    rows = await fetch(conn, statement, params)
    if len(rows) > 1:
        raise sa_exc.MultipleResultsFound("Multiple rows were found when one or none was required")
    return rows[0] if rows else None


def _arguments(compiled: _Compiled, params: Mapping[str, Any]) -> tuple[str, list[Any]]:
    """The SQL to run and its arguments in position, bind-processed."""
    if compiled.expanding:  # its SQL is rendered for these values
        state = compiled.compiled.construct_expanded_state(params)
        # (its processors are those of the parameters it expanded)
        processors = {**compiled.compiled._bind_processors, **state.processors}
        values, names = state.parameters, state.positiontup or ()
        binds = [cast(Processor, processors.get(name)) for name in names]
        sql = state.statement
        if compiled.constants is not None:  # rendered the same every time: from now on, so
            expanded = {n for ns in state.parameter_expansion.values() for n in ns}
            compiled.constants = {name: values[name] for name in expanded}
            compiled.sql, compiled.names, compiled.binds = sql, tuple(names), tuple(binds)
            compiled.expanding = False
    elif compiled.constants:
        values = {**compiled.compiled.construct_params(params), **compiled.constants}
        names, binds, sql = compiled.names, list(compiled.binds), compiled.sql
    else:
        values, names = compiled.compiled.construct_params(params), compiled.names
        binds, sql = list(compiled.binds), compiled.sql
    return sql, [
        bind(values[name]) if bind is not None else values[name]
        for name, bind in zip(names, binds, strict=True)
    ]


def _result_processors(
    compiled: _Compiled, attributes: Sequence[Any], dialect: Dialect
) -> tuple[Processor, ...]:
    """Each column's result processor, for the type the driver reports for it (by OID)."""
    if len(compiled.types) != len(attributes):
        return (None,) * len(attributes)
    return tuple(
        type_._cached_result_processor(dialect, attribute.type.oid)
        for type_, attribute in zip(compiled.types, attributes, strict=True)
    )


async def _translated(
    conn: AsyncConnection, adapted: Any, sql: str, args: list[Any], error: Exception
) -> Exception:
    """The error conn.execute raises for the driver's `error`; a lost connection is
    invalidated (not put back in the pool)."""
    dialect = conn.dialect
    base: Any = dialect.loaded_dbapi.Error
    try:
        adapted._handle_exception(error)
    except base as dbapi_error:
        lost = dialect.is_disconnect(dbapi_error, adapted, None)
        if lost:
            await conn.invalidate()
        translated: Exception = sa_exc.DBAPIError.instance(
            sql, args, dbapi_error, base, connection_invalidated=lost, dialect=dialect
        )
        return translated
    except Exception as other:  # not the driver's: as it is
        return other
    return error  # (_handle_exception always raises)
