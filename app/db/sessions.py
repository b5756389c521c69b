"""Session row queries, always scoped by tenant where a caller names a session."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    RowMapping,
    Select,
    Text,
    Update,
    bindparam,
    case,
    func,
    literal,
    literal_column,
    or_,
    select,
    text,
    tuple_,
    type_coerce,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB, aggregate_order_by
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core.agents import AgentPin, resolved
from app.core.entries import JournalEntry
from app.core.lineage import Lineage, Segment, lineage_from_json, lineage_to_json
from app.core.runs import ACTIVE
from app.core.sessions import Session, SessionConfig, SessionStatus
from app.db import hot
from app.db.tables import entries, runs, sessions, tenants

# A session past its expiry is gone for its tenant at once, before the retention job purges it.
LIVE = or_(sessions.c.expires_at.is_(None), sessions.c.expires_at > func.now())


def _session(row: Mapping[str, Any] | RowMapping) -> Session:
    """The row as a typed value. Its config is taken as stored: it was validated on the way in,
    and is read on every ask."""
    return Session(
        id=str(row["id"]),
        tenant_id=str(row["tenant_id"]),
        title=row["title"],
        metadata=row["metadata"],
        config=SessionConfig.from_json(
            resolved(row["agent_config"], row["config"])
            if row["agent_config"] is not None
            else row["config"]
        ),
        status=SessionStatus(row["status"]),
        rev=int(row["rev"]),
        parent_id=str(row["parent_id"]) if row["parent_id"] is not None else None,
        fork_seq=row["fork_seq"],
        lineage=lineage_from_json(row["lineage"]),
        input_tokens=int(row["input_tokens"]),
        output_tokens=int(row["output_tokens"]),
        cached_tokens=int(row["cached_tokens"]),
        cache_write_tokens=int(row["cache_write_tokens"]),
        reasoning_tokens=int(row["reasoning_tokens"]),
        cost_usd=row["cost_usd"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        expires_at=row["expires_at"],
        agent=AgentPin(
            str(row["agent_id"]), row["agent_name"], row["agent_version"], row["agent_config"]
        )
        if row["agent_id"] is not None
        else None,
        own_config=SessionConfig.from_json(row["config"])
        if row["agent_config"] is not None
        else None,
    )


def _one_or_none(row: RowMapping | None) -> Session | None:
    return _session(row) if row is not None else None


async def insert_session(conn: AsyncConnection, **values: Any) -> Session:
    result = await conn.execute(sessions.insert().values(**values).returning(sessions))
    return _session(result.mappings().one())


async def get_session(
    conn: AsyncConnection,
    tenant_id: str,
    session_id: str,
    *,
    lock: bool = False,
    include_expired: bool = False,
) -> Session | None:
    """One live (unexpired) session of this tenant; with `lock`, its row is locked for update.
    `include_expired`: expired too (for a run under way: expiry refuses new requests, it does
    not break work already started)."""
    query = _get_session(lock, include_expired)
    params = {"session_id": session_id, "tenant_id": tenant_id}
    return _one_or_none((await conn.execute(query, params)).mappings().one_or_none())


@dataclass(frozen=True)
class AsRead:
    """A session read unlocked (get_session_as_read)."""

    session: Session
    version: int  # its row's xmin, which every write of the row changes
    # The thread's newest entries, read with it, when it is all stored under the session.
    newest: Newest | None


async def get_session_as_read(
    conn: AsyncConnection, tenant_id: str, session_id: str
) -> AsRead | None:
    """get_session (unlocked), the version of its row that was read, and its thread's newest
    entries, in one statement. A statement that writes only if the row is still the one read
    compares the version (app/db/runs.insert_asked_run's `unchanged`)."""
    params = {"session_id": session_id, "tenant_id": tenant_id, "newest_limit": NEWEST_ENTRIES}
    row = await hot.fetch_one_or_none(conn, _get_session_as_read(), params)
    if row is None:
        return None
    session = _session(row)
    return AsRead(session, int(row["row_version"]), _own_newest(session, row["newest"]))


# The version of the session's row read: its xmin (get_session_as_read).
_ROW_VERSION = literal_column("sessions.xmin", BigInteger)
# The session's row is the version `advance_as_read` (its xmin, as get_session_as_read reads it).
_AS_READ = text("sessions.xmin = CAST(:advance_as_read AS xid)")


@functools.cache  # built once: constructing it cost more CPU than running it
def _get_session_as_read() -> Select[Any]:
    return _get_session(False, False).add_columns(
        _ROW_VERSION.label("row_version"), _newest(bindparam("session_id")).label("newest")
    )


@functools.cache  # built once per shape: constructing it cost more CPU than running it
def _get_session(lock: bool, include_expired: bool) -> Select[Any]:
    query = select(sessions).where(
        sessions.c.id == bindparam("session_id"), sessions.c.tenant_id == bindparam("tenant_id")
    )
    if not include_expired:
        query = query.where(LIVE)
    return query.with_for_update() if lock else query


@dataclass(frozen=True)
class Newest:
    """The newest entries of a thread stored in one range (ascending), at most `limit` of them,
    read in one statement with its session (read_for_run): app/db/journal.tail_from serves
    read_tail's pages from them, while they reach, with no snapshot held open for the reads."""

    entries: list[JournalEntry]
    limit: int

    @property
    def reaches_start(self) -> bool:
        return len(self.entries) < self.limit

    @classmethod
    def of(cls, entries: list[JournalEntry], complete: bool) -> Newest:
        """A thread's newest entries (all of them, if `complete`) however they were read."""
        return cls(entries, len(entries) + 1 if complete else len(entries))


_ENTRY_FIELDS = ("seq", "id", "kind", "payload", "refs", "token_count")
# Two of read_tail's first pages and one more: all a thread of up to 128 entries has (fewer
# than this: the thread's start was reached), and all one whose newest page suffices needs.
NEWEST_ENTRIES = 2 * 64 + 1


@dataclass(frozen=True)
class RunStart:
    """What a run starting reads of its session, in one statement (app/worker/run.py)."""

    session: Session | None  # None: not the tenant's (or gone)
    compacting: bool  # a compaction run of the session is under way
    written: list[JournalEntry]  # the entries the run wrote so far (run_entries')
    # The thread's newest entries, when it is all stored under the session (no ancestors).
    newest: Newest | None = None
    # The version of the session's row read (see get_session_as_read); None with no session.
    version: int | None = None

    def with_newest(self, told: Newest | None) -> RunStart:
        """This read, with the thread's newest entries `told` instead (read by the ask that
        made the run, its own appended) when they end at the rev read here, so are the same
        entries, and reach further back than the ones read here."""
        if told is None or self.session is None or self.newest is None or not told.entries:
            return self
        if told.entries[-1].seq != self.session.rev:
            return self  # appended to since: the entries read here are the thread's newest
        if len(told.entries) <= len(self.newest.entries):
            return self
        return replace(self, newest=told)


async def read_for_run(
    conn: AsyncConnection,
    tenant_id: str,
    session_id: str,
    run_id: str,
    from_seq: int,
    *,
    with_newest: bool = True,
) -> RunStart:
    """The session (expired too: work under way goes on), whether a compaction of it is under
    way, and what the run has written (app/db/journal.run_entries), in one statement: in the
    caller's snapshot, as three would read them. `with_newest`: the thread's newest entries too
    (RunStart.newest); not for a caller that reads the thread in its snapshot anyway."""
    params = {
        "session_id": session_id,
        "tenant_id": tenant_id,
        "from_seq": from_seq,
        **run_start_params(run_id, with_newest),
    }
    row = (await conn.execute(_read_for_run(), params)).mappings().one_or_none()
    return run_start_of(row, with_newest)


def run_start_params(run_id: str, with_newest: bool = True) -> dict[str, Any]:
    """run_start_columns' parameters."""
    return {"run_refs": {"run_id": run_id}, "newest_limit": NEWEST_ENTRIES if with_newest else 0}


def run_start_of(row: Mapping[str, Any] | None, with_newest: bool, prefix: str = "") -> RunStart:
    """The RunStart of a row read with run_start_columns (None, or no session: not the
    tenant's, or gone)."""
    if row is None or row[f"{prefix}id"] is None:
        return RunStart(None, False, [])
    session = _session({c.name: row[f"{prefix}{c.name}"] for c in sessions.c})
    return RunStart(
        session,
        bool(row[f"{prefix}compacting"]),
        [JournalEntry(**e) for e in row[f"{prefix}written"]],
        _own_newest(session, row[f"{prefix}newest"]) if with_newest else None,
        int(row[f"{prefix}row_version"]),
    )


def _own_newest(session: Session, rows: list[dict[str, Any]]) -> Newest | None:
    """The newest entries read (`rows`), if the session's thread is all its own (a fork's
    reaches into its ancestors, which they do not cover)."""
    if session.thread not in ([Segment(session.id, 0, None)], []):
        return None
    return Newest([JournalEntry(**e) for e in rows], NEWEST_ENTRIES)


@functools.cache  # built once: constructing it cost more CPU than running it
def _read_for_run() -> Select[Any]:
    columns = run_start_columns(bindparam("session_id"), bindparam("from_seq"))
    return select(*columns).where(
        sessions.c.id == bindparam("session_id"), sessions.c.tenant_id == bindparam("tenant_id")
    )


def run_start_columns(
    session_id: ColumnElement[Any], from_seq: ColumnElement[Any], prefix: str = ""
) -> list[ColumnElement[Any]]:
    """What read_for_run reads, as the columns of a statement whose FROM has the session's row
    (sessions): its columns, `compacting`, `written`, `newest` and `row_version`, named after
    `prefix`; the parameters: run_start_params'."""
    compacting = (
        select(runs.c.id)
        .where(
            runs.c.session_id == sessions.c.id,
            runs.c.kind == "compaction",
            runs.c.status.in_([s.value for s in ACTIVE]),
        )
        .exists()
    )
    entry = func.jsonb_build_object(
        "seq",
        entries.c.seq,
        "id",
        entries.c.id,
        "kind",
        entries.c.kind,
        "payload",
        entries.c.payload,
        "refs",
        entries.c.refs,
        "token_count",
        entries.c.token_count,
    )
    written = (
        select(
            func.coalesce(
                func.jsonb_agg(aggregate_order_by(entry, entries.c.seq)),
                literal_column("'[]'::jsonb"),
            )
        )
        .where(
            entries.c.session_id == sessions.c.id,
            entries.c.seq >= from_seq,
            entries.c.refs.contains(bindparam("run_refs", type_=JSONB)),
        )
        .scalar_subquery()
    )
    return [
        *(c.label(f"{prefix}{c.name}") for c in sessions.c),
        compacting.label(f"{prefix}compacting"),
        type_coerce(written, JSONB).label(f"{prefix}written"),
        _newest(session_id).label(f"{prefix}newest"),
        _ROW_VERSION.label(f"{prefix}row_version"),
    ]


def _newest(session_id: ColumnElement[Any]) -> ColumnElement[Any]:
    """The session's newest stored entries (at most `:newest_limit`), ascending, as a JSON
    array of _ENTRY_FIELDS objects."""
    newest_rows = (
        select(*(entries.c[name] for name in _ENTRY_FIELDS))
        .where(entries.c.session_id == session_id)
        .order_by(entries.c.seq.desc())
        .limit(bindparam("newest_limit"))
        .subquery("newest")
    )
    newest = select(
        func.coalesce(
            func.jsonb_agg(
                aggregate_order_by(
                    func.jsonb_build_object(
                        *(part for name in _ENTRY_FIELDS for part in (name, newest_rows.c[name]))
                    ),
                    newest_rows.c.seq,
                )
            ),
            literal_column("'[]'::jsonb"),
        )
    ).scalar_subquery()
    return type_coerce(newest, JSONB)


async def tenant_of(conn: AsyncConnection, session_id: str) -> str | None:
    """The tenant a live session belongs to (for operators' commands, which name no tenant)."""
    query = select(sessions.c.tenant_id).where(sessions.c.id == session_id, LIVE)
    tenant_id = (await conn.execute(query)).scalar()
    return str(tenant_id) if tenant_id is not None else None


async def list_sessions(
    conn: AsyncConnection,
    tenant_id: str,
    *,
    limit: int,
    before: tuple[datetime, str] | None,
    metadata: dict[str, str],
    title_contains: str | None = None,
    parent_id: str | None = None,
) -> list[Session]:
    """Newest first; `before` is the (created_at, id) keyset cursor of the previous page."""
    query = select(sessions).where(sessions.c.tenant_id == tenant_id, LIVE)
    if metadata:
        query = query.where(sessions.c.metadata.contains(metadata))
    if title_contains:
        # A substring, case-insensitively: LIKE's wildcards in it are literal characters.
        query = query.where(sessions.c.title.icontains(title_contains, autoescape=True))
    if parent_id is not None:
        query = query.where(sessions.c.parent_id == parent_id)
    if before is not None:
        created_at, session_id = before
        cursor = tuple_(
            literal(created_at, sessions.c.created_at.type), literal(session_id, sessions.c.id.type)
        )
        query = query.where(tuple_(sessions.c.created_at, sessions.c.id) < cursor)
    query = query.order_by(sessions.c.created_at.desc(), sessions.c.id.desc()).limit(limit)
    return [_session(row) for row in (await conn.execute(query)).mappings()]


async def update_session(conn: AsyncConnection, session_id: str, values: dict[str, Any]) -> Session:
    query = (
        update(sessions)
        .where(sessions.c.id == session_id)
        .values(**values, updated_at=func.now())
        .returning(sessions)
    )
    return _session((await conn.execute(query)).mappings().one())


async def set_lineage(conn: AsyncConnection, session_id: str, lineage: Lineage) -> None:
    query = (
        update(sessions)
        .where(sessions.c.id == session_id)
        .values(lineage=lineage_to_json(lineage), updated_at=func.now())
    )
    await conn.execute(query)


async def delete_session(conn: AsyncConnection, session_id: str) -> None:
    await conn.execute(sessions.delete().where(sessions.c.id == session_id))


async def run_ids(conn: AsyncConnection, session_id: str) -> list[str]:
    query = select(runs.c.id).where(runs.c.session_id == session_id)
    return [str(i) for i in (await conn.execute(query)).scalars()]


def ttl_expiry(ttl_seconds: int) -> ColumnElement[Any]:
    """The database's now() plus `ttl_seconds`: one clock, the one expiry is checked against."""
    return func.now() + func.make_interval(0, 0, 0, 0, 0, 0, ttl_seconds)


def tenant_default_expiry(tenant_id: str) -> ColumnElement[Any]:
    """now() plus the tenant's default session TTL; null when the tenant has none."""
    ttl = func.make_interval(0, 0, 0, 0, 0, 0, tenants.c.session_ttl_seconds)
    return select(func.now() + ttl).where(tenants.c.id == tenant_id).scalar_subquery()


async def expired_session_ids(conn: AsyncConnection, now: datetime | None, limit: int) -> list[str]:
    """Up to `limit` sessions expired at `now` (default: the database's now()), newest first:
    a fork sorts before its parent, so an expiring fork is purged before its shared prefix
    would be copied into it."""
    moment = func.now() if now is None else literal(now, sessions.c.expires_at.type)
    query = (
        select(sessions.c.id)
        .where(sessions.c.expires_at <= moment)
        .order_by(sessions.c.created_at.desc(), sessions.c.id.desc())
        .limit(limit)
    )
    return [str(i) for i in (await conn.execute(query)).scalars()]


async def lock_expired(conn: AsyncConnection, session_id: str, now: datetime | None) -> bool:
    """Lock the session if it is (still) expired at `now`; whether it is."""
    moment = func.now() if now is None else literal(now, sessions.c.expires_at.type)
    query = (
        select(sessions.c.id)
        .where(sessions.c.id == session_id, sessions.c.expires_at <= moment)
        .with_for_update()
    )
    return (await conn.execute(query)).first() is not None


# Every transaction that locks several sessions takes the locks in this one order, so forks and
# deletes of related sessions can never deadlock. (A parent sorts before its forks.)
LOCK_ORDER = (sessions.c.created_at, sessions.c.id)


async def sessions_reading_from(
    conn: AsyncConnection, session_id: str
) -> list[tuple[str, Lineage]]:
    """Every session whose thread includes entries stored under `session_id`, locked: its id
    and lineage."""
    query = (
        select(sessions.c.id, sessions.c.lineage)
        .where(sessions.c.lineage.contains([{"session_id": session_id}]))
        .order_by(*LOCK_ORDER)
        .with_for_update()
    )
    return [(str(id), lineage_from_json(raw)) for id, raw in (await conn.execute(query)).all()]


async def lock_existing(conn: AsyncConnection, session_ids: list[str]) -> int:
    """Key-share lock these sessions so none is deleted meanwhile; return how many exist."""
    if not session_ids:
        return 0
    query = (
        select(sessions.c.id)
        .where(sessions.c.id.in_(session_ids))
        .order_by(*LOCK_ORDER)
        .with_for_update(key_share=True, read=True)
    )
    return len((await conn.execute(query)).all())


@dataclass(frozen=True)
class RunEnded:
    """What an append at a run's end sets on its session besides its rev: the status, idle
    unless another of its runs is still under way, and the run's usage added to its totals
    (column -> amount; none when the run reported none)."""

    run_id: str
    usage: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Advance:
    """The statement that reserves seqs (built once per shape: see advancing) and the values
    it binds."""

    statement: Update
    params: dict[str, Any]
    shape: tuple[Any, ...]


def advancing(
    tenant_id: str,
    session_id: str,
    count: int,
    expected_rev: int | None,
    include_expired: bool = False,
    values: Mapping[str, Any] | None = None,
    title: str | None = None,
    ended: RunEnded | None = None,
    as_read: int | None = None,
) -> Advance:
    """The statement that reserves `count` seqs by moving rev forward, returning the new rev
    (app/services/journal runs it, alone or with the entries' insert: app/db/journal.
    insert_advancing); the row lock serializes appenders, and is held until the transaction
    ends, so the seqs stay dense. `values`: more of the session's columns to set with it (its
    status...), plain values; `title`: the session's title if it has none; `ended`: see
    RunEnded. No row when the session's rev is not `expected_rev`, or its row is no longer
    the version `as_read` (see get_session_as_read; compared after any wait for the row), or
    the tenant has no such session."""
    values = values or {}
    usage = ended.usage if ended is not None and ended.usage is not None else {}
    shape = (
        include_expired,
        expected_rev is not None,
        title is not None,
        tuple(sorted(values)),
        ended is not None,
        tuple(sorted(usage)),
        as_read is not None,
    )
    statement = advancing_statement(*shape)
    params: dict[str, Any] = {
        "advance_tenant": tenant_id,
        "advance_session": session_id,
        "advance_count": count,
        **{f"advance_set_{name}": value for name, value in values.items()},
        **{f"advance_add_{name}": amount for name, amount in usage.items()},
    }
    if expected_rev is not None:
        params["advance_expected_rev"] = expected_rev
    if as_read is not None:
        params["advance_as_read"] = as_read
    if title is not None:
        params["advance_title"] = title
    if ended is not None:
        params["advance_ended_run"] = ended.run_id
    return Advance(statement, params, shape)


@functools.cache  # built once per shape: constructing it cost more CPU than running it
def advancing_statement(
    include_expired: bool,
    expected: bool,
    titled: bool,
    names: tuple[str, ...],
    ended: bool,
    added: tuple[str, ...],
    compared: bool = False,
) -> Update:
    query = update(sessions).where(
        sessions.c.id == bindparam("advance_session"),
        sessions.c.tenant_id == bindparam("advance_tenant"),
    )
    if not include_expired:
        query = query.where(LIVE)
    if expected:
        query = query.where(sessions.c.rev == bindparam("advance_expected_rev"))
    if compared:
        query = query.where(_AS_READ)
    values: dict[str, Any] = {
        "rev": sessions.c.rev + bindparam("advance_count", type_=BigInteger),
        "updated_at": func.now(),
        **{name: bindparam(f"advance_set_{name}", type_=sessions.c[name].type) for name in names},
        **{
            name: sessions.c[name] + bindparam(f"advance_add_{name}", type_=sessions.c[name].type)
            for name in added
        },
    }
    if titled:
        values["title"] = func.coalesce(sessions.c.title, bindparam("advance_title", type_=Text))
    if ended:
        others_active = (
            select(runs.c.id)
            .where(
                runs.c.session_id == sessions.c.id,
                runs.c.id != bindparam("advance_ended_run", type_=runs.c.id.type),
                runs.c.status.in_([s.value for s in ACTIVE]),
            )
            .exists()
        )
        values["status"] = case((others_active, sessions.c.status), else_="idle")
    return query.values(**values).returning(sessions.c.rev)


async def current_rev(
    conn: AsyncConnection, tenant_id: str, session_id: str, include_expired: bool = False
) -> int | None:
    query = select(sessions.c.rev).where(
        sessions.c.id == session_id, sessions.c.tenant_id == tenant_id
    )
    if not include_expired:
        query = query.where(LIVE)
    rev: int | None = (await conn.execute(query)).scalar()
    return rev
