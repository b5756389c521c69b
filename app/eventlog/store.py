"""Run event queries: the SSE log of each run, and the notification that new events exist."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Boolean,
    Integer,
    RowMapping,
    TextClause,
    column,
    func,
    literal,
    select,
    text,
)
from sqlalchemy.ext.asyncio import AsyncConnection

from app.db import hot
from app.db.tables import run_events, runs

CHANNEL = "threadline_run_events"
# NOTIFY payloads are limited to 8000 bytes; past this a notification just says "look".
_MAX_PAYLOAD = 7000
# Event seqs are int4: a resume point past this is past every event there can be.
MAX_EVENT_SEQ = 2**31 - 1


@functools.cache  # built once per shape: text() parses its SQL on every construction
def _append_statement(fenced: bool) -> TextClause:
    return text(
        "WITH written AS ("
        "INSERT INTO run_events (run_id, seq, type, data)"
        " SELECT e.run_id,"
        "  COALESCE((SELECT max(x.seq) FROM run_events x WHERE x.run_id = e.run_id), 0) + e.ord,"
        "  e.type, e.data"
        " FROM unnest(CAST(:run_ids AS uuid[]), CAST(:ords AS int[]), CAST(:types AS text[]),"
        "  CAST(CAST(:datas AS text[]) AS jsonb[]), CAST(:attempts AS int[]))"
        "  AS e(run_id, ord, type, data, attempt)"
        + (
            " JOIN runs r ON r.id = e.run_id AND r.attempts = e.attempt"
            " AND r.status IN ('running', 'requires_action', 'awaiting_approval') FOR SHARE OF r"
            if fenced
            else ""
        )
        + " RETURNING run_id, seq),"
        " last AS (SELECT run_id, max(seq) AS seq FROM written GROUP BY run_id),"
        " told AS (SELECT pg_notify(:channel, CASE WHEN length(p) > :max_payload"
        "   THEN json_build_object('all', true)::text ELSE p END)"
        "  FROM (SELECT json_build_object('runs', json_object_agg(run_id, seq))::text AS p"
        "   FROM last HAVING count(*) > 0) AS payload)"
        # `told` is read (a CTE without data changes runs only as far as it is read), in an
        # inner join: a left join to it, its output unused, would be planned away.
        " SELECT run_id, seq, n.told FROM last, (SELECT count(*) AS told FROM told) AS n"
    )


async def append_events(
    conn: AsyncConnection,
    events: Sequence[tuple[str, str, Mapping[str, Any]]],
    attempts: Mapping[str, int] | None = None,
) -> dict[str, int]:
    """Append (run_id, type, data) events in one INSERT; returns each run's last seq.

    The only place run events are inserted (but run_event's, each with its run's row), and
    the one seq allocator (run_event's allocates the same way): each run's events take the
    seqs after its highest one, in order, so a run's seqs are dense whoever writes them.
    With `attempts` (a worker's writes), a run's events are written only while the run is
    still at that attempt: those of a superseded attempt are dropped (its run is missing from
    the answer). The run row is share-locked, so a takeover waits for the write or fences it.

    The same statement tells every API process which runs have events up to which seq (a
    NOTIFY, sent on commit; none when nothing was written): no round trip of its own."""
    if not events:
        return {}
    fenced = attempts is not None
    order: dict[str, int] = {}
    ords = []
    for run_id, _, _ in events:
        order[run_id] = order.get(run_id, 0) + 1
        ords.append(order[run_id])
    query = _append_statement(fenced)
    params = {
        "attempts": [(attempts or {}).get(e[0], 0) for e in events],
        "run_ids": [e[0] for e in events],
        "ords": ords,
        "types": [str(e[1]) for e in events],
        "datas": [json.dumps(e[2], separators=(",", ":")) for e in events],
        "channel": CHANNEL,
        "max_payload": _MAX_PAYLOAD,
    }
    rows = await hot.fetch(conn, query, params)
    return {str(row["run_id"]): int(row["seq"]) for row in rows}


# One event of the run a statement writes (its CTE `run`: inserted, or updated), appended after
# the run's last event and announced by the same statement: the `run_event` and `told_event`
# CTEs, which must follow `run`; `told_event` must be read.
@functools.cache  # one per set of the run's columns its data takes
def _run_event(from_run: tuple[str, ...]) -> str:
    written, told = _run_event_bodies(from_run)
    return f"run_event AS ({written}), told_event AS ({told})"


@functools.cache
def _run_event_bodies(from_run: tuple[str, ...]) -> tuple[str, str]:
    data = "CAST(:event_data AS jsonb)"
    if from_run:
        data += " || jsonb_build_object(" + ", ".join(f"'{c}', run.{c}" for c in from_run) + ")"
    return (
        "INSERT INTO run_events (run_id, seq, type, data)"
        " SELECT run.id, coalesce((SELECT max(x.seq) FROM run_events x WHERE x.run_id = run.id),"
        f"  0) + 1, :event_type, {data} FROM run RETURNING run_id, seq",
        "SELECT pg_notify(:channel, json_build_object('runs',"
        "  json_build_object(run_id, seq))::text) AS told FROM run_event",
    )


def run_event(
    kind: str, data: Mapping[str, Any], from_run: tuple[str, ...] = ()
) -> tuple[str, dict[str, Any]]:
    """One event of the run a statement writes (app.db.runs: a new run's run.created, a first
    start's run.started): the CTEs that append and announce it, and their parameters.
    `from_run`: columns of the run's row the statement writes (known only then), set in the
    event's data under their names."""
    params = {
        "event_type": kind,
        "event_data": json.dumps(data, separators=(",", ":")),
        "channel": CHANNEL,
    }
    return _run_event(from_run), params


# The start event of a run inserted started by the statement that wrote its `run_event` (the
# CTE `run`'s status is then 'running'): appended after it and announced, by the CTEs
# `started_event` (its seq; none for a run inserted queued) and `started_told`, which must be
# read.
_RUN_STARTED = (
    "started_event AS (INSERT INTO run_events (run_id, seq, type, data)"
    "  SELECT run.id, run_event.seq + 1, :started_type, CAST(:started_data AS jsonb)"
    "  FROM run, run_event WHERE run.status = 'running' RETURNING run_id, seq),"
    " started_told AS (SELECT pg_notify(:channel, json_build_object('runs',"
    "  json_build_object(run_id, seq))::text) AS told FROM started_event)"
)


def run_started(kind: str, data: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """The start event of a run its statement may insert started (app/db/runs.insert_asked_run),
    after its run_event's: the CTEs (_RUN_STARTED) and their parameters (the channel's is
    run_event's)."""
    params = {"started_type": kind, "started_data": json.dumps(data, separators=(",", ":"))}
    return _RUN_STARTED, params


# A run's last events, appended after its last one (as append_events allocates seqs) and
# announced, by the statement that ends the run (app/db/runs.end_run, whose `:end_run` names the
# run), unless steers are pending for it: the CTEs `end_events` (the seqs written) and
# `end_events_told`, which must be read.
_CLOSING_EVENTS = (
    "INSERT INTO run_events (run_id, seq, type, data)"
    " SELECT CAST(:end_run AS uuid),"
    "  coalesce((SELECT max(x.seq) FROM run_events x WHERE x.run_id = CAST(:end_run AS uuid)), 0)"
    "  + e.ord, e.type, CAST(e.data AS jsonb)"
    " FROM unnest(CAST(:closing_types AS text[]), CAST(:closing_datas AS text[]))"
    "  WITH ORDINALITY AS e(type, data, ord)"
    " WHERE NOT EXISTS (SELECT 1 FROM steers s"
    "  WHERE s.run_id = CAST(:end_run AS uuid) AND s.status = 'pending')"
    " RETURNING seq",
    "SELECT pg_notify(:closing_channel, json_build_object('runs',"
    " json_build_object(CAST(:end_run AS text), max(seq)))::text) AS told"
    " FROM end_events HAVING count(*) > 0",
)


def closing_events(
    events: Sequence[tuple[str, Mapping[str, Any]]],
) -> tuple[tuple[str, str], dict[str, Any]]:
    """A run's last (type, data) events, for the statement that ends it: the CTEs that append
    and announce them (_CLOSING_EVENTS), and their parameters."""
    params = {
        "closing_types": [str(kind) for kind, _ in events],
        "closing_datas": [json.dumps(data, separators=(",", ":")) for _, data in events],
        "closing_channel": CHANNEL,
    }
    return _CLOSING_EVENTS, params


def run_event_ctes(kind: str, data: Mapping[str, Any]) -> tuple[tuple[str, str], dict[str, Any]]:
    """run_event's CTEs apart, for a statement built with SQLAlchemy: the bodies of `run_event`
    (its run_id and seq) and `told_event` (to be read), and their parameters."""
    _, params = run_event(kind, data)
    return _run_event_bodies(()), params


def numbered(
    events: Sequence[tuple[str, str, Mapping[str, Any]]], last: Mapping[str, int]
) -> list[dict[str, Any]]:
    """The rows append_events wrote, as a follower reads them ({run_id, seq, type, data}):
    each run's events took the seqs up to its last one, in order; a run missing from `last`
    (fenced) wrote none."""
    counts: dict[str, int] = {}
    for run_id, _, _ in events:
        counts[run_id] = counts.get(run_id, 0) + 1
    taken = dict.fromkeys(counts, 0)
    rows = []
    for run_id, kind, data in events:
        if run_id not in last:
            continue
        taken[run_id] += 1
        seq = last[run_id] - counts[run_id] + taken[run_id]
        rows.append({"run_id": run_id, "seq": seq, "type": str(kind), "data": as_jsonb(data)})
    return rows


def as_jsonb(value: Any) -> Any:
    """`value` as it reads back from a jsonb column: object keys in jsonb's order (shorter keys
    first, then by their bytes; the last of duplicate keys). A row handed out from memory
    then serializes to the same bytes as the same row read from the table."""
    if isinstance(value, Mapping):
        items = sorted(
            ((str(k), as_jsonb(v)) for k, v in value.items()),
            key=lambda kv: (len(kv[0].encode()), kv[0].encode()),
        )
        return dict(items)
    if isinstance(value, list | tuple):
        return [as_jsonb(v) for v in value]
    return value


async def last_seq(conn: AsyncConnection, run_id: str) -> int:
    query = select(func.coalesce(func.max(run_events.c.seq), 0)).where(
        run_events.c.run_id == run_id
    )
    return int((await conn.execute(query)).scalar_one())


async def last_seq_of_type(conn: AsyncConnection, run_id: str, event_type: str) -> int:
    """The seq of the run's latest event of `event_type` (0: none)."""
    query = select(func.coalesce(func.max(run_events.c.seq), 0)).where(
        run_events.c.run_id == run_id, run_events.c.type == event_type
    )
    return int((await conn.execute(query)).scalar_one())


async def read_events(
    conn: AsyncConnection, run_id: str, after_seq: int, limit: int = 1000, *, tenant_id: str
) -> list[RowMapping]:
    """A tenant's run's events after `after_seq`, in order; none if the run is not the tenant's."""
    owned = select(runs.c.id).where(runs.c.id == run_id, runs.c.tenant_id == tenant_id)
    return await _events_after(conn, run_id, after_seq, limit, owned.exists())


async def _events_after(
    conn: AsyncConnection, run_id: str, after_seq: int, limit: int, *conditions: Any
) -> list[RowMapping]:
    query = (
        select(run_events.c.run_id, run_events.c.seq, run_events.c.type, run_events.c.data)
        .where(run_events.c.run_id == run_id, run_events.c.seq > after_seq, *conditions)
        .order_by(run_events.c.seq)
        .limit(limit)
    )
    return list((await conn.execute(query)).mappings())


@dataclass(frozen=True)
class Backlog:
    """A follower's view of a run from a resume point: the events after it, and whether the
    run was over before they were read (then they are all it will ever have)."""

    rows: Sequence[dict[str, Any]]
    ended: bool  # the run had ended, or no longer exists, when the rows were read
    last_seq: int  # its highest event seq as of that moment (0: none, or pruned)


async def read_backlog(
    conn: AsyncConnection, run_id: str, after_seq: int, limit: int = 1000
) -> Backlog:
    """The run's state and its events after `after_seq`, in one statement (one snapshot): a
    run's terminal event commits with its final status, so events read with seeing it ended
    are complete. By run id alone: the event hub reads for every tenant's followers of its
    process, each subscribed once its request found the run in its tenant."""
    rows = (
        await conn.execute(
            _BACKLOG,
            {"run_id": run_id, "after_seq": min(after_seq, MAX_EVENT_SEQ), "limit": limit},
        )
    ).all()
    events = [
        {"run_id": r.run_id, "seq": r.seq, "type": r.type, "data": r.data}
        for r in rows
        if r.seq is not None
    ]
    return Backlog(events, bool(rows[0].ended), int(rows[0].top))


# ended_at is set with the final status, by the transaction that commits the terminal event;
# a run that no longer exists counts as ended. Always one row at least (the state's), with
# no event when there is none after the resume point.
_BACKLOG = text(
    "SELECT s.ended, s.top, e.run_id, e.seq, e.type, e.data FROM"
    " (SELECT coalesce((SELECT r.ended_at IS NOT NULL FROM runs r"
    "   WHERE r.id = CAST(:run_id AS uuid)), true) AS ended,"
    "  coalesce((SELECT max(x.seq) FROM run_events x"
    "   WHERE x.run_id = CAST(:run_id AS uuid)), 0) AS top) AS s"
    " LEFT JOIN LATERAL (SELECT run_events.run_id, run_events.seq, run_events.type,"
    "  run_events.data FROM run_events WHERE run_events.run_id = CAST(:run_id AS uuid)"
    "  AND run_events.seq > :after_seq ORDER BY run_events.seq LIMIT :limit) AS e ON true"
).columns(
    column("ended", Boolean),
    column("top", Integer),
    run_events.c.run_id,
    run_events.c.seq,
    run_events.c.type,
    run_events.c.data,
)


async def read_events_of_runs(
    conn: AsyncConnection, cursors: Mapping[str, int], limit: int = 5000
) -> list[RowMapping]:
    """New events of several runs at once, each after its own cursor."""
    if not cursors:
        return []
    params = {"ids": list(cursors), "afters": list(cursors.values()), "limit": limit}
    return list((await conn.execute(_EVENTS_OF_RUNS, params)).mappings())


_EVENTS_OF_RUNS = text(
    "SELECT e.run_id, e.seq, e.type, e.data FROM run_events e"
    " JOIN unnest(CAST(:ids AS uuid[]), CAST(:afters AS int[])) AS c(run_id, after_seq)"
    " ON e.run_id = c.run_id AND e.seq > c.after_seq"
    " ORDER BY e.run_id, e.seq LIMIT :limit"
).columns(run_events.c.run_id, run_events.c.seq, run_events.c.type, run_events.c.data)


@dataclass(frozen=True)
class Pruned:
    run_ids: list[str]  # the runs whose events went
    events: int


async def prune(
    conn: AsyncConnection,
    retention_seconds: float,
    now: datetime | None = None,
    limit: int | None = None,
) -> Pruned:
    """Drop the events of runs that ended longer ago than the retention, as of `now` (default:
    the database's clock), at most `limit` runs (default: all), oldest first; the journal
    remains. Each run is pruned once (runs.events_pruned, skipping runs another prune holds):
    a prune costs what ended since the last one, not every run ever."""
    moment = func.now() if now is None else literal(now, runs.c.ended_at.type)
    due = (
        select(runs.c.id)
        .where(
            runs.c.ended_at < moment - func.make_interval(0, 0, 0, 0, 0, 0, retention_seconds),
            ~runs.c.events_pruned,
        )
        .order_by(runs.c.ended_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    marked = runs.update().where(runs.c.id.in_(due)).values(events_pruned=True)
    run_ids = [str(i) for i in (await conn.execute(marked.returning(runs.c.id))).scalars()]
    if not run_ids:
        return Pruned([], 0)
    result = await conn.execute(run_events.delete().where(run_events.c.run_id.in_(run_ids)))
    return Pruned(run_ids, int(result.rowcount or 0))
