"""Run row queries: rows in, typed runs out."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    Insert,
    Integer,
    Select,
    Text,
    TextualSelect,
    Update,
    and_,
    bindparam,
    column,
    func,
    select,
    text,
    true,
    type_coerce,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.exc import DBAPIError, IntegrityError, NoResultFound
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core.entries import JournalEntry
from app.core.runs import ACTIVE, Run, RunStatus
from app.db import hot
from app.db import jobs as jobs_db
from app.db import journal as journal_db
from app.db.sessions import (
    LIVE,
    RunStart,
    run_start_columns,
    run_start_of,
    run_start_params,
)
from app.db.tables import runs, sessions, steers, webhook_endpoints
from app.db.tenants import USAGE_ADDED
from app.db.webhooks import WANTING

_ACTIVE = [s.value for s in ACTIVE]


# The runs table's columns in its Table's order (the database's may differ: added columns).
_RUN_COLUMNS = ", ".join(f"run.{c.name}" for c in runs.c)


@dataclass(frozen=True)
class QueuedRun:
    run: Run
    claimed: bool  # its job was inserted taken by the given worker (see insert_queued_run)
    # Its first event (run.created, seq 1) as followers read it; set by the run's creation
    # (app/services/run_transitions.create), which made it.
    created: dict[str, Any] | None = None
    # An ask's run: the entries it wrote (its user entry, run_start) as committed; set by
    # app/services/run_transitions.create_asked.
    entries: tuple[JournalEntry, ...] = ()
    # An ask's run started by the ask's own statement (insert_asked_run's `start_under`).
    started: AskedStart | None = None


@dataclass(frozen=True)
class AskedStart:
    """What the statement of an ask that started its run wrote besides: the run's start event
    (its seq), and the session's row as the statement left it."""

    event_seq: int
    rev: int
    version: int  # the row's xmin (as app/db/sessions.get_session_as_read reads it)
    title: str | None
    updated_at: datetime
    compacting: bool  # a compaction run of the session was under way (read_for_run's)


async def insert_queued_run(
    conn: AsyncConnection,
    created: tuple[str, Mapping[str, Any]],
    *,
    id: str,
    tenant_id: str,
    session_id: str,
    kind: str,
    model: str,
    params: dict[str, Any],
    idempotency_key: str | None,
    user_entry_seq: int | None,
    claim_for: int | None = None,
) -> QueuedRun:
    """One statement (one round trip): the run's job deferred, the run inserted with its
    job_id, and its first event (run.created) appended and announced (`created`: the
    statement's part that does it, with its parameters: app.eventlog.store.run_event). No
    worker sees the job before the caller's transaction commits, the run with it. `claim_for`:
    a procrastinate worker id of this process, which takes the job at once if its session's
    lock allows (jobs_db.CLAIMED_OR_DEFERRED): that worker must then start the run."""
    query = _insert_queued_run(created[0])
    values: dict[str, Any] = {"user_entry_seq": user_entry_seq}
    values |= _run_values(id, tenant_id, session_id, kind, model, params, idempotency_key)
    row = await _inserted_run(conn, query, created, values, claim_for)
    assert row is not None  # written on no condition
    return QueuedRun(Run.from_row(row), bool(row["claimed"]))


def _run_values(
    id: str,
    tenant_id: str,
    session_id: str,
    kind: str,
    model: str,
    params: dict[str, Any],
    idempotency_key: str | None,
) -> dict[str, Any]:
    """_RUN_INSERT's parameters (but the seq its caller's statement gives) and its job's."""
    return {
        "id": id,
        "tenant_id": tenant_id,
        "session_id": session_id,
        "kind": kind,
        "model": model,
        "params": json.dumps(params),
        "idempotency_key": idempotency_key,
        **jobs_db.run_job_params(id, session_id, kind),
    }


async def _inserted_run(
    conn: AsyncConnection,
    query: TextualSelect,
    created: tuple[str, Mapping[str, Any]],
    values: dict[str, Any],
    claim_for: int | None,
) -> Mapping[str, Any] | None:
    """The row a statement inserting a run answers; None: it wrote nothing (only a statement
    written on a condition, insert_asked_run's, does not)."""
    values = values | {"worker_id": claim_for} | dict(created[1])
    return await hot.fetch_one_or_none(conn, query, values)


# A run inserted with its job (the CTE `job`: jobs_db.CLAIMED_OR_DEFERRED), as the CTE `run`;
# its user entry's seq is the SQL its statement gives ({user_entry_seq}), from {source};
# {started}: when that SQL condition holds, it is inserted started (its first attempt, under
# the lease {lease}), else queued.
_RUN_INSERT = (
    "run AS (INSERT INTO runs (id, tenant_id, session_id, kind, model, params,"
    "  idempotency_key, user_entry_seq, job_id, status, lease, attempts, started_at)"
    "  SELECT CAST(:id AS uuid), CAST(:tenant_id AS uuid), CAST(:session_id AS uuid),"
    "  :kind, :model, CAST(:params AS jsonb), :idempotency_key,"
    "  {user_entry_seq}, job.id,"
    "  CASE WHEN {started} THEN 'running' ELSE 'queued' END,"
    "  CASE WHEN {started} THEN {lease} END,"
    "  CASE WHEN {started} THEN 1 ELSE 0 END,"
    "  CASE WHEN {started} THEN now() END"
    "  FROM {source} RETURNING *)"
)
# What a statement inserting a run (and its first event: `created`'s CTEs) answers with.
_RUN_INSERTED = (
    f"SELECT {_RUN_COLUMNS}, (SELECT count(*) FROM told_event) AS told,"
    " (SELECT claimed FROM job) AS claimed FROM run"
)


@functools.cache  # built once per event part: text() parses its SQL on every construction
def _insert_queued_run(created: str) -> TextualSelect:
    run = _RUN_INSERT.format(
        user_entry_seq="CAST(:user_entry_seq AS bigint)", source="job", started="false", lease="0"
    )
    return text(f"WITH {jobs_db.CLAIMED_OR_DEFERRED}, {run}, {created} {_RUN_INSERTED}").columns(
        *runs.c, column("told", Integer), column("claimed", Boolean)
    )  # typed by position


async def insert_asked_run(
    conn: AsyncConnection,
    created: tuple[str, Mapping[str, Any]],
    started: tuple[str, Mapping[str, Any]],
    entries: Sequence[Mapping[str, Any]],
    input_at: int,
    title: str | None,
    *,
    id: str,
    tenant_id: str,
    session_id: str,
    model: str,
    params: dict[str, Any],
    idempotency_key: str | None,
    claim_for: int | None = None,
    unchanged: int | None = None,
    start_under: int | None = None,
) -> QueuedRun | None:
    """An ask's commit in one statement (one round trip): `entries` (rows as the entries table
    takes them: id, kind, payload, refs, token_count) appended to the session, which is active
    now, at the seqs after its rev (moved past them; its title set from `title` if it has
    none), and an ask's run inserted as insert_queued_run does, its user_entry_seq that of
    `entries[input_at]` (`created` takes it from the run's row: app.eventlog.store.run_event's
    `from_run`). The caller holds the session's row locked; or, with `unchanged` (a version of
    the session's row: app/db/sessions.get_session_as_read), nothing is written unless the row
    is still that version when the statement takes its lock (a write that waited for it
    compares the row as committed), and None answers when it was not.

    `start_under`: the lease of the worker `claim_for` names: when the job is taken, the run
    is inserted started too, its first attempt under that lease, with its start event
    (`started`: the statement's part that appends it after `created`'s, with its parameters:
    app.eventlog.store.run_started), as app/db/runs.start_first would start it; what that
    wrote is QueuedRun.started. The caller then executes the run (or ends its job failed, and
    the run recovery queues it again)."""
    query = _insert_asked_run(created[0], started[0])
    values: dict[str, Any] = {
        **started[1],
        "advance_title": title,
        "entry_count": len(entries),
        "input_ord": input_at + 1,
        "unchanged": unchanged,
        "start_under": start_under,
    }
    values |= journal_db.entry_arrays(entries)
    values |= _run_values(id, tenant_id, session_id, "ask", model, params, idempotency_key)
    row = await _inserted_run(conn, query, created, values, claim_for)
    if row is None:
        return None
    queued = QueuedRun(Run.from_row(row), bool(row["claimed"]))
    if row["started_seq"] is None:
        return queued
    asked_start = AskedStart(
        int(row["started_seq"]),
        int(row["s_rev"]),
        int(row["s_version"]),
        row["s_title"],
        row["s_updated_at"],
        bool(row["s_compacting"]),
    )
    return replace(queued, started=asked_start)


@functools.cache  # built once per event part: text() parses its SQL on every construction
def _insert_asked_run(created: str, started_event: str) -> TextualSelect:
    # What app/db/sessions.advancing and app/db/journal.insert_advancing write for an append
    # that sets the session's status (include_expired: the caller checked the session).
    seq = "advanced.rev - :entry_count + :input_ord"
    lease = "CAST(:start_under AS bigint)"
    started = f"(job.claimed AND {lease} IS NOT NULL)"
    run = _RUN_INSERT.format(
        user_entry_seq=seq, source="job, advanced", started=started, lease=lease
    )
    compacting = (
        "EXISTS (SELECT 1 FROM runs c WHERE c.session_id = run.session_id"
        f"  AND c.kind = 'compaction' AND c.status IN ({', '.join(repr(s) for s in _ACTIVE)}))"
    )
    return text(
        "WITH advanced AS (UPDATE sessions SET rev = rev + :entry_count, updated_at = now(),"
        "  status = 'active', title = coalesce(title, CAST(:advance_title AS text))"
        "  WHERE id = CAST(:session_id AS uuid) AND tenant_id = CAST(:tenant_id AS uuid)"
        "  AND (CAST(:unchanged AS xid) IS NULL OR xmin = CAST(:unchanged AS xid))"
        "  RETURNING rev, xmin AS version, title, updated_at),"
        " appended AS (INSERT INTO entries (session_id, seq, id, kind, payload, refs,"
        "  token_count)"
        "  SELECT CAST(:session_id AS uuid), advanced.rev - :entry_count + e.ord, e.id, e.kind,"
        "  CAST(e.payload AS jsonb), CAST(e.refs AS jsonb), e.token_count"
        "  FROM advanced, unnest(CAST(:entry_ids AS text[]), CAST(:entry_kinds AS text[]),"
        "   CAST(:entry_payloads AS text[]), CAST(:entry_refs AS text[]),"
        "   CAST(:entry_tokens AS int[]))"
        "   WITH ORDINALITY AS e(id, kind, payload, refs, token_count, ord)"
        "  RETURNING seq),"
        f" {jobs_db.claimed_or_deferred('EXISTS (SELECT 1 FROM advanced)')}, {run}, {created},"
        f" {started_event}"
        f" SELECT {_RUN_COLUMNS}, (SELECT count(*) FROM told_event) AS told,"
        "  (SELECT claimed FROM job) AS claimed,"
        "  (SELECT seq FROM started_event) AS started_seq,"
        "  (SELECT count(*) FROM started_told) AS started_told,"
        "  advanced.rev AS s_rev, advanced.version AS s_version, advanced.title AS s_title,"
        f"  advanced.updated_at AS s_updated_at, {compacting} AS s_compacting"
        "  FROM run, advanced"
    ).columns(  # typed by position
        *runs.c,
        column("told", Integer),
        column("claimed", Boolean),
        column("started_seq", Integer),
        column("started_told", Integer),
        column("s_rev", BigInteger),
        column("s_version", BigInteger),
        column("s_title", Text),
        column("s_updated_at", DateTime(timezone=True)),
        column("s_compacting", Boolean),
    )


async def get_run(
    conn: AsyncConnection,
    run_id: str,
    *,
    tenant_id: str | None = None,
    lock: bool = False,
    skip_locked: bool = False,
) -> Run | None:
    """A run by id; with `tenant_id` (a client asking), only if it belongs to that tenant and
    its session has not expired. `lock`: its session's row is locked first, then the run's,
    the order in which an ask takes them (it locks its session, then a run it steers): a
    transaction that goes on to write the session (a run's end) never deadlocks with a steer,
    and its later statements see every run and steer committed under the session's lock while
    it waited (a statement that waits for a row reads other tables as they were before the
    wait). `skip_locked` (with `lock`): None rather than wait for a transaction that has the
    run locked; only the run's row is locked then (a busy session does not skip it)."""
    query = _get_run(tenant_id is not None, lock, skip_locked)
    params = {"run_id": run_id, "tenant_id": tenant_id}
    return _run((await conn.execute(query, params)).mappings().one_or_none())


async def lock_with_rev(conn: AsyncConnection, run_id: str) -> tuple[Run, int] | None:
    """get_run(lock=True), and its session's rev as that lock holds it: the seqs the caller's
    transaction appends next follow it (a run's end: app/services/run_transitions.finish)."""
    params = {"run_id": run_id, "tenant_id": None}
    row = (await conn.execute(_lock_with_rev(), params)).mappings().one_or_none()
    return None if row is None else (Run.from_row(row), int(row["session_rev"]))


@functools.cache  # built once: constructing it cost more CPU than running it
def _lock_with_rev() -> Select[Any]:
    return _get_run(False, True, False).add_columns(sessions.c.rev.label("session_rev"))


@functools.cache  # built once per shape: constructing it cost more CPU than running it
def _get_run(of_tenant: bool, lock: bool, skip_locked: bool) -> Select[Any]:
    query = select(runs).where(runs.c.id == bindparam("run_id"))
    with_session = lock and not skip_locked
    if with_session:
        query = query.join(sessions, sessions.c.id == runs.c.session_id)
    if of_tenant:
        live = (
            LIVE
            if with_session
            else select(sessions.c.id).where(sessions.c.id == runs.c.session_id, LIVE).exists()
        )
        query = query.where(runs.c.tenant_id == bindparam("tenant_id"), live)
    if not lock:
        return query
    if skip_locked:
        return query.with_for_update(skip_locked=True)
    return query.with_for_update(of=[sessions, runs])  # in this order: the session's row first


async def find_by_idempotency_key(conn: AsyncConnection, session_id: str, key: str) -> Run | None:
    query = select(runs).where(runs.c.session_id == session_id, runs.c.idempotency_key == key)
    return _run((await conn.execute(query)).mappings().one_or_none())


async def active_runs(
    conn: AsyncConnection, session_id: str, kind: str | None = None, *, tenant_id: str
) -> list[Run]:
    """Unfinished runs of a tenant's session (of one kind, if given), oldest first."""
    params = {"session_id": session_id, "tenant_id": tenant_id, "kind": kind}
    rows = (await conn.execute(_active_runs(kind is not None), params)).mappings()
    return [Run.from_row(r) for r in rows]


@functools.cache  # built once per shape: constructing it cost more CPU than running it
def _active_runs(of_kind: bool) -> Select[Any]:
    query = (
        select(runs)
        .where(
            runs.c.session_id == bindparam("session_id"),
            runs.c.tenant_id == bindparam("tenant_id"),
            runs.c.status.in_(_ACTIVE),
        )
        .order_by(runs.c.created_at, runs.c.id)
    )
    return query.where(runs.c.kind == bindparam("kind")) if of_kind else query


async def update_run(conn: AsyncConnection, run_id: str, values: dict[str, Any]) -> Run:
    query = update(runs).where(runs.c.id == run_id).values(**values).returning(runs)
    return Run.from_row((await conn.execute(query)).mappings().one())


@dataclass(frozen=True)
class Ended:
    run: Run  # as now written
    webhook_endpoints: list[str]  # the endpoints that want its end (app/db/webhooks.wanting)
    steers_pending: bool  # steers sent to it are still to be settled
    # The seq of the last of the events given to end_run, when it wrote them (no steer was
    # pending); else None.
    last_event_seq: int | None = None


class Changed(Exception):
    """A statement written on condition that its rows were still as read (end_run's
    `as_read`) found them changed, or wanted more than one statement: it wrote nothing."""


# What threadline_still_as_read raises (migration e5b9d3a7c214); Postgres's deadlock_detected.
CHANGED_SQLSTATE, DEADLOCK_SQLSTATE = "TL001", "40P01"


async def end_run(
    conn: AsyncConnection,
    run_id: str,
    values: dict[str, Any],
    usage: dict[str, Any] | None,
    wanting: dict[str, Any],
    job_id: int | None = None,
    events: tuple[tuple[str, str], dict[str, Any]] | None = None,
    appended: tuple[Insert, dict[str, Any]] | None = None,
    as_read: int | None = None,
) -> Ended:
    """update_run for a run's end (`values`: plain values; ended_at is now), in one statement
    with the tenant's usage counted (`usage`: app/db/tenants.usage_added's values), the webhook
    endpoints that want its end read (`wanting`: app/db/webhooks.wanting_values'), whether
    steers are pending for it, `job_id` (its job, held by a worker of this process) finished,
    succeeded, and its last events appended and announced unless steers are pending (their
    events come first: the caller then appends them all), `events` being the statement's part
    that does it (app.eventlog.store.closing_events); `appended`: its closing entries'
    append (app/db/journal.advancing_insert), made by the same statement. The caller holds
    the run's
    row locked, and its session's, since an earlier statement of its transaction
    (get_run(lock=True)): steers are committed under those locks, so this statement sees every
    one.

    Or, with `as_read` (the run's attempt, which the caller's worker runs) and `appended`
    written only if the session's row is still as the caller read it (app/db/sessions.
    advancing's `as_read`), the caller holds no lock: the statement is all of the end, on an
    autocommit connection. It aborts (Changed) unless the run is still running that attempt,
    not being cancelled, the session's row unchanged, and nothing needs more than this
    statement (a steer pending, a webhook endpoint that wants the end). Every write that bears
    on a run's end writes one of those two rows (a steer, a run's creation or end, a cancel,
    an append), and the statement compares them once it holds their locks: what it read is
    what a locking read would have let it read."""
    guarded = as_read is not None
    assert not guarded or appended is not None, "the session's row is compared by the append"
    shape = (tuple(sorted(values)), usage is not None, job_id is not None)
    query = _end_run(
        *shape,
        events[0] if events is not None else None,
        appended[0] if appended is not None else None,
        guarded,
    )
    params = {"end_run": run_id, **{f"end_{k}": v for k, v in values.items()}, **wanting}
    if job_id is not None:
        params |= {"finish_job_id": job_id, "finish_job_status": "succeeded"}
    if guarded:
        params["end_attempt"] = as_read
    for part in (events, appended):
        if part is not None:
            params |= part[1]
    try:
        row = await hot.fetch_one_or_none(conn, query, params | (usage or {}))
    except DBAPIError as exc:
        # (an IntegrityError: the run was deleted; a deadlock: rows locked meanwhile)
        changed = getattr(exc.orig, "sqlstate", None) in (CHANGED_SQLSTATE, DEADLOCK_SQLSTATE)
        if guarded and (changed or isinstance(exc, IntegrityError)):
            raise Changed(run_id) from exc
        raise
    if row is None:
        if guarded:
            raise Changed(run_id)
        raise NoResultFound(f"run {run_id} is gone")
    if appended is not None and row["appended_last_seq"] != values.get("end_entry_seq"):
        # The seqs the caller gave its entries, from the session's rev under its lock: a
        # mismatch is a bug, and rolls the transaction back.
        raise RuntimeError(f"run {run_id}: its end's entries took other seqs than expected")
    last = row["last_event_seq"] if events is not None else None
    return Ended(
        Run.from_row(row),
        [str(e) for e in row["webhook_endpoints"] or []],
        bool(row["steers_pending"]),
        int(last) if last is not None else None,
    )


@functools.cache  # built once per shape: constructing it cost more CPU than running it
def _end_run(
    names: tuple[str, ...],
    counted: bool,
    finishing_job: bool,
    events: tuple[str, str] | None,
    appended: Insert | None,
    guarded: bool = False,
) -> Update:
    endpoints = select(func.array_agg(webhook_endpoints.c.id)).where(WANTING).scalar_subquery()
    pending = (
        select(steers.c.id)
        .where(steers.c.run_id == runs.c.id, steers.c.status == "pending")
        .exists()
    )
    query = (
        update(runs)
        .where(runs.c.id == bindparam("end_run"))
        .values(
            # The statement's time, not its transaction's start: the end's append may wait for
            # the session's row behind a burst of asks, and the run ends when that is over.
            ended_at=func.clock_timestamp(),
            **{name: bindparam(f"end_{name}", type_=runs.c[name].type) for name in names},
        )
        .returning(runs, endpoints.label("webhook_endpoints"), pending.label("steers_pending"))
    )
    if events is not None:
        written = text(events[0]).columns(column("seq", Integer)).cte("end_events")
        told = text(events[1]).columns(column("told", Text)).cte("end_events_told")
        query = query.add_cte(written, told)
        last = select(func.max(written.c.seq)).scalar_subquery()
        announced = select(func.count()).select_from(told).scalar_subquery()  # read: it runs
        query = query.returning(last.label("last_event_seq"), announced.label("told"))
    if appended is not None:
        entries = appended.cte("end_entries")
        query = query.add_cte(entries)
        appended_last = select(func.max(entries.c.seq)).scalar_subquery()
        query = query.returning(appended_last.label("appended_last_seq"))
    if guarded and appended is not None:
        as_read = runs.alias("run_as_read")
        run_as_read = (
            select(as_read.c.id)
            .where(
                as_read.c.id == bindparam("end_run"),
                as_read.c.status == RunStatus.RUNNING.value,
                as_read.c.cancel_mode.is_(None),
                as_read.c.attempts == bindparam("end_attempt", type_=Integer),
            )
            .with_for_update()
            .cte("run_as_read")
        )
        # Read where the row is updated, before it is: one that fails aborts all of it. In
        # this order (an AND's terms are evaluated in turn): the session's row is locked (by
        # the append's update of it) before the run's, the order of an ask that steers.
        unchanged = and_(
            select(entries.c.seq).exists(),  # the session's row was still as read
            select(run_as_read.c.id).exists(),
            ~pending,
            endpoints.is_(None),
        )
        query = query.add_cte(run_as_read).where(
            func.threadline_still_as_read(unchanged, type_=Boolean)
        )
    if finishing_job:
        # Returned, so that it runs (a CTE nothing reads is not evaluated), once the row is
        # written: the job's row is locked after the run's (and its session's), as a cancel
        # locks them.
        finished = text(f"SELECT true AS finished FROM {jobs_db.FINISH_JOB}")
        job = finished.columns(column("finished", Boolean)).cte("job")
        done = select(job.c.finished).scalar_subquery()
        query = query.add_cte(job).returning(done.label("job_finished"))
    return query.add_cte(USAGE_ADDED.cte("usage")) if counted else query


async def start_attempt(conn: AsyncConnection, run_id: str, status: RunStatus, lease: int) -> Run:
    """Count a new attempt of the run, now `status` (running) under the worker's `lease`."""
    values = {
        "status": status.value,
        "lease": lease,
        "attempts": runs.c.attempts + 1,
        "started_at": func.coalesce(runs.c.started_at, func.now()),
    }
    return await update_run(conn, run_id, values)


@dataclass(frozen=True)
class FirstStart:
    run: Run  # started: its first attempt, under the given lease
    event_seq: int  # its start event's
    steered: bool  # steers were pending for it when it started
    # What the run reads of its session to start (app/db/sessions.read_for_run), read by the
    # same statement.
    start: RunStart


async def start_first(
    conn: AsyncConnection,
    run_id: str,
    status: RunStatus,
    lease: int,
    started: tuple[tuple[str, str], Mapping[str, Any]],
) -> FirstStart | None:
    """One statement (on an autocommit connection, its own transaction): the first attempt of a
    run that was never started and is not being cancelled (queued, attempts 0), now `status`
    under `lease`, its start event appended and announced (`started`: the statement's part
    that does it, app.eventlog.store.run_event_ctes), and what the run reads of its session
    to start (read_for_run's, in the statement's snapshot). None: not such a run (the caller
    starts it under its row's lock, as start_attempt's callers do). The update takes the row's
    lock: it waits for a cancel holding it, then finds the run cancelled."""
    query = _start_first(started[0])
    values = {"id": run_id, "status": status.value, "lease": lease, **started[1]}
    values |= run_start_params(run_id)
    row = (await conn.execute(query, values)).mappings().one_or_none()
    if row is None:
        return None
    return FirstStart(
        Run.from_row(row),
        int(row["event_seq"]),
        bool(row["steered"]),
        run_start_of(row, with_newest=True, prefix=_SESSION),
    )


_SESSION = "s_"  # start_first's columns of the session (no run column starts so)


@functools.cache  # built once per event part: constructing it cost more CPU than running it
def _start_first(started: tuple[str, str]) -> Select[Any]:
    run = (
        text(
            "UPDATE runs SET status = :status, lease = :lease, attempts = 1,"
            " started_at = coalesce(started_at, now())"
            " WHERE id = CAST(:id AS uuid) AND status = 'queued' AND attempts = 0"
            " AND cancel_mode IS NULL RETURNING *"
        )
        .columns(*runs.c)
        .cte("run")
    )
    event = text(started[0]).columns(column("run_id"), column("seq", Integer)).cte("run_event")
    told = text(started[1]).columns(column("told", Text)).cte("told_event")
    steered = (
        select(steers.c.id)
        .where(steers.c.run_id == run.c.id, steers.c.status == "pending")
        .exists()
    )
    announced = select(func.count()).select_from(told).scalar_subquery()  # read: it runs
    session = and_(sessions.c.id == run.c.session_id, sessions.c.tenant_id == run.c.tenant_id)
    return (
        select(
            *run.c,
            event.c.seq.label("event_seq"),
            announced.label("told"),
            steered.label("steered"),
            *run_start_columns(run.c.session_id, run.c.user_entry_seq, prefix=_SESSION),
        )
        .select_from(run.join(event, true()).outerjoin(sessions, session))
        .add_cte(run, event, told)
    )


async def expired_actions(conn: AsyncConnection) -> list[Run]:
    """Runs waiting for client tool outputs past their deadline, locked with their sessions'
    rows (as get_run locks them), skipping any another transaction holds."""
    query = (
        select(runs)
        .join(sessions, sessions.c.id == runs.c.session_id)
        .where(runs.c.status == "requires_action", runs.c.action_expires_at < func.now())
        .with_for_update(of=[sessions, runs], skip_locked=True)
    )
    return [Run.from_row(r) for r in (await conn.execute(query)).mappings()]


async def expired_approvals(conn: AsyncConnection) -> list[Run]:
    """Runs waiting for approvals past their deadline, locked with their sessions' rows (as
    get_run locks them), skipping any another transaction holds."""
    query = (
        select(runs)
        .join(sessions, sessions.c.id == runs.c.session_id)
        .where(runs.c.status == "awaiting_approval", runs.c.action_expires_at < func.now())
        .with_for_update(of=[sessions, runs], skip_locked=True)
    )
    return [Run.from_row(r) for r in (await conn.execute(query)).mappings()]


async def active_inline_mcp(conn: AsyncConnection) -> list[tuple[str, list[dict[str, Any]]]]:
    """(id, params.mcp_inline) of every active run with MCP servers of its request's own."""
    inline = runs.c.params["mcp_inline"]
    query = select(runs.c.id, inline).where(
        runs.c.status.in_([str(s) for s in ACTIVE]),
        func.jsonb_typeof(inline) == "array",
        inline != type_coerce([], JSONB),  # (jsonb_array_length could meet a scalar first)
    )
    return [(str(row[0]), list(row[1])) for row in await conn.execute(query)]


async def set_inline_mcp(conn: AsyncConnection, run_id: str, servers: list[dict[str, Any]]) -> None:
    merged = runs.c.params.op("||")(
        func.jsonb_build_object("mcp_inline", type_coerce(servers, JSONB))
    )
    await conn.execute(update(runs).where(runs.c.id == run_id).values(params=merged))


async def count_asks(conn: AsyncConnection, session_id: str) -> int:
    """The session's turns: runs answering an ask (compactions are not turns)."""
    query = (
        select(func.count())
        .select_from(runs)
        .where(runs.c.session_id == session_id, runs.c.kind == "ask")
    )
    return int((await conn.execute(query)).scalar_one())


def _run(row: Any) -> Run | None:
    return None if row is None else Run.from_row(row)


# The leases held in this database: a bigint advisory lock key shows in pg_locks as classid
# (its high 32 bits) and objid (its low 32 bits), with objsubid 1.
HELD_LEASES = (
    "SELECT (l.classid::bigint << 32) | l.objid::bigint FROM pg_locks l"
    " WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1"
    " AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
)


# After a database restart, how long the workers (alive, but their leases dropped with their
# connections) have to take their leases again before their attempts count as abandoned.
LEASE_GRACE_SECONDS = 5.0
# An attempt whose worker is gone: its lease (the SQL expression `{lease}`) is set and no
# longer held, past the grace that follows a database restart.
LEASE_LOST = (
    "({lease} IS NOT NULL AND {lease} NOT IN (" + HELD_LEASES + ")"
    " AND pg_postmaster_start_time() < now() - make_interval(secs => :grace))"
)


async def lease_held(conn: AsyncConnection, lease: int | None) -> bool:
    if lease is None:
        return False
    query = text(f"SELECT CAST(:lease AS bigint) IN ({HELD_LEASES})")
    return bool((await conn.execute(query, {"lease": lease})).scalar_one())


async def lease_lost(
    conn: AsyncConnection, lease: int | None, grace_seconds: float = LEASE_GRACE_SECONDS
) -> bool:
    """Whether the worker of the attempt under `lease` is gone (LEASE_LOST); False for no
    lease: no attempt is under way (a run queued, or queued again between two attempts)."""
    if lease is None:
        return False
    query = text("SELECT " + LEASE_LOST.format(lease="CAST(:lease AS bigint)"))
    params = {"lease": lease, "grace": grace_seconds}
    return bool((await conn.execute(query, params)).scalar_one())


@dataclass(frozen=True)
class Orphan:
    """An unfinished run nobody will finish: its worker's lease is gone, or its job ended."""

    run: Run
    job_status: str | None  # None: the job row is gone


async def orphaned_runs(
    conn: AsyncConnection, lease_grace_seconds: float = LEASE_GRACE_SECONDS, limit: int = 100
) -> list[Orphan]:
    """Runs `queued` or `running` whose job has ended (failed, aborted, or succeeded without
    ending the run) or is gone, and runs `running` whose lease is no longer held; locked,
    each with its session's row (as get_run locks them: a recovery that ends a run writes its
    session), skipping any another transaction holds: taken at the next look.

    A database restart drops every lease at once while their workers live on: for
    `lease_grace_seconds` after the server started, leases are given time to be taken again."""
    query = text(
        "SELECT r.*, j.status AS job_status FROM sessions s JOIN runs r ON r.session_id = s.id"
        " LEFT JOIN procrastinate_jobs j ON j.id = r.job_id"
        " WHERE r.status IN ('queued', 'running') AND ("
        "  j.id IS NULL OR j.status NOT IN ('todo', 'doing')"
        "  OR (r.status = 'running' AND " + LEASE_LOST.format(lease="r.lease") + ")"
        " ) ORDER BY r.created_at LIMIT :limit FOR UPDATE OF s, r SKIP LOCKED"
    )
    params = {"limit": limit, "grace": lease_grace_seconds}
    rows = (await conn.execute(query, params)).mappings().all()
    return [Orphan(Run.from_row(r), r["job_status"]) for r in rows]
