"""Entry queries across a thread's storage segments (a fork reads its ancestors' ranges)."""

from __future__ import annotations

import functools
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from sqlalchemy import (
    BigInteger,
    Insert,
    RowMapping,
    Text,
    and_,
    bindparam,
    cast,
    false,
    func,
    literal,
    or_,
    select,
    text,
    true,
    union_all,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql import Select

from app.core.entries import JournalEntry
from app.core.lineage import Segment
from app.db.sessions import Advance, Newest, advancing_statement
from app.db.tables import entries, sessions

ENTRY_COLUMNS = (
    entries.c.seq,
    entries.c.id,
    entries.c.kind,
    entries.c.payload,
    entries.c.refs,
    entries.c.token_count,
    entries.c.created_at,
)


def _in_segment(segment: Segment, after_seq: int | None, before_seq: int | None) -> Any:
    low = max(segment.after_seq, after_seq) if after_seq is not None else segment.after_seq
    conditions = [entries.c.session_id == segment.session_id, entries.c.seq > low]
    if segment.upto_seq is not None:
        conditions.append(entries.c.seq <= segment.upto_seq)
    if before_seq is not None:
        conditions.append(entries.c.seq < before_seq)
    return and_(*conditions)


def _overlaps(segment: Segment, after_seq: int | None, before_seq: int | None) -> bool:
    if after_seq is not None and segment.upto_seq is not None and segment.upto_seq <= after_seq:
        return False
    return before_seq is None or before_seq > segment.after_seq + 1


async def read_entries(
    conn: AsyncConnection,
    segments: Sequence[Segment],
    *,
    after_seq: int | None = None,
    before_seq: int | None = None,
    kinds: Sequence[str] | None = None,
    descending: bool = False,
    limit: int,
) -> list[RowMapping]:
    """A page of a thread in seq order.

    One index-ordered, limited scan per segment, merged by Postgres (Merge Append): reading the
    newest page costs the same whatever the thread's length.
    """
    if len(segments) == 1:  # most threads: one statement, built once per shape
        (segment,) = segments
        if not _overlaps(segment, after_seq, before_seq):
            return []
        low = max(segment.after_seq, after_seq) if after_seq is not None else segment.after_seq
        query = _segment_page(
            segment.upto_seq is not None, before_seq is not None, bool(kinds), descending
        )
        params = {
            "session_id": segment.session_id,
            "low": low,
            "upto": segment.upto_seq,
            "before": before_seq,
            "kinds": list(kinds or ()),
            "limit": limit,
        }
        return list((await conn.execute(query, params)).mappings())
    parts: list[Select[Any]] = []
    for segment in segments:
        if not _overlaps(segment, after_seq, before_seq):
            continue
        part = select(*ENTRY_COLUMNS).where(_in_segment(segment, after_seq, before_seq))
        if kinds:
            part = part.where(entries.c.kind.in_(kinds))
        order = entries.c.seq.desc() if descending else entries.c.seq.asc()
        parts.append(part.order_by(order).limit(limit))
    if not parts:
        return []
    if len(parts) == 1:
        query = parts[0]
        return list((await conn.execute(query)).mappings())
    merged = union_all(*(p.subquery().select() for p in parts)).subquery()
    order = merged.c.seq.desc() if descending else merged.c.seq.asc()
    query = select(merged).order_by(order).limit(limit)
    return list((await conn.execute(query)).mappings())


@functools.cache  # built once per shape: constructing it cost more CPU than running it
def _segment_page(upto: bool, before: bool, of_kinds: bool, descending: bool) -> Select[Any]:
    query = select(*ENTRY_COLUMNS).where(
        entries.c.session_id == bindparam("session_id"), entries.c.seq > bindparam("low")
    )
    if upto:
        query = query.where(entries.c.seq <= bindparam("upto"))
    if before:
        query = query.where(entries.c.seq < bindparam("before"))
    if of_kinds:
        query = query.where(entries.c.kind.in_(bindparam("kinds", expanding=True)))
    order = entries.c.seq.desc() if descending else entries.c.seq.asc()
    return query.order_by(order).limit(bindparam("limit"))


async def find_by_entry_ids(
    conn: AsyncConnection, segments: Sequence[Segment], entry_ids: Sequence[str]
) -> list[RowMapping]:
    """Entries of this thread whose client ids are among `entry_ids`."""
    parts = [
        select(*ENTRY_COLUMNS).where(_in_segment(s, None, None), entries.c.id.in_(entry_ids))
        for s in segments
    ]
    query = parts[0] if len(parts) == 1 else union_all(*parts)
    return list((await conn.execute(query)).mappings())


async def insert_entries(
    conn: AsyncConnection, session_id: str, rows: Sequence[dict[str, Any]]
) -> list[RowMapping]:
    """Insert rows that already carry their seq; returns them as stored."""
    query = entries.insert().returning(*ENTRY_COLUMNS)
    stored = (await conn.execute(query, [{**r, "session_id": session_id} for r in rows])).mappings()
    return sorted(stored, key=lambda r: int(r["seq"]))


async def insert_advancing(
    conn: AsyncConnection, advance: Advance, session_id: str, rows: Sequence[dict[str, Any]]
) -> list[RowMapping]:
    """insert_entries and the session's rev update (`advance`, returning the new rev: see
    app/db/sessions.advancing) in one statement: the rows take the seqs the update reserved,
    in order. Returns them as stored; none when the update found no row to move."""
    query, params = advancing_insert(advance, session_id, rows)
    return sorted((await conn.execute(query, params)).mappings(), key=lambda r: int(r["seq"]))


def advancing_insert(
    advance: Advance, session_id: str, rows: Sequence[dict[str, Any]]
) -> tuple[Insert, dict[str, Any]]:
    """insert_advancing's statement (built once per shape) and parameters, for a caller that
    runs it as a part of its own (a run's end: app/db/runs.end_run)."""
    params = {
        **advance.params,
        "entry_session": session_id,
        "entry_count": len(rows),
        **entry_arrays(rows),
    }
    return _insert_advancing(advance.shape), params


def entry_arrays(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """The rows (as the entries table takes them, but their seqs) as the arrays a statement
    unnests: entry_ids, entry_kinds, entry_payloads, entry_refs and entry_tokens."""
    return {
        "entry_ids": [r["id"] for r in rows],
        "entry_kinds": [r["kind"] for r in rows],
        "entry_payloads": [json.dumps(r["payload"]) for r in rows],
        "entry_refs": [json.dumps(r["refs"]) for r in rows],
        "entry_tokens": [r["token_count"] for r in rows],
    }


@functools.cache  # built once per shape of its advance: see advancing_statement
def _insert_advancing(shape: tuple[Any, ...]) -> Insert:
    advanced = advancing_statement(*shape).cte("advanced")
    taken = (
        func.unnest(
            bindparam("entry_ids", type_=ARRAY(Text)),
            bindparam("entry_kinds", type_=ARRAY(Text)),
            bindparam("entry_payloads", type_=ARRAY(Text)),
            bindparam("entry_refs", type_=ARRAY(Text)),
            bindparam("entry_tokens", type_=ARRAY(BigInteger)),
        )
        .table_valued("id", "kind", "payload", "refs", "token_count", with_ordinality="ord")
        .render_derived()
    )
    values = select(
        bindparam("entry_session", type_=UUID(as_uuid=False)),
        advanced.c.rev - bindparam("entry_count", type_=BigInteger) + taken.c.ord,
        taken.c.id,
        taken.c.kind,
        cast(taken.c.payload, JSONB),
        cast(taken.c.refs, JSONB),
        taken.c.token_count,
    ).select_from(advanced.join(taken, true()))
    columns = ["session_id", "seq", "id", "kind", "payload", "refs", "token_count"]
    return entries.insert().from_select(columns, values).returning(*ENTRY_COLUMNS)


async def copy_range(
    conn: AsyncConnection, source_id: str, target_id: str, after_seq: int, upto_seq: int
) -> None:
    """Materialize source's entries in (after_seq, upto_seq] under target, seqs unchanged."""
    columns = ["seq", "id", "kind", "payload", "refs", "token_count", "created_at"]
    source = select(
        literal(target_id, type_=UUID(as_uuid=False)).label("session_id"),
        *(entries.c[c] for c in columns),
    ).where(
        entries.c.session_id == source_id,
        entries.c.seq > after_seq,
        entries.c.seq <= upto_seq,
    )
    await conn.execute(entries.insert().from_select(["session_id", *columns], source))


def journal_entry(row: RowMapping | Mapping[str, Any]) -> JournalEntry:
    """A stored entry as the pure core reads it."""
    return JournalEntry(
        seq=int(row["seq"]),
        kind=str(row["kind"]),
        payload=row["payload"],
        refs=row["refs"],
        token_count=int(row["token_count"]),
        id=str(row["id"]),
    )


# read_tail's pages: the first, and the largest they double to.
FIRST_PAGE, MAX_PAGE = 64, 512


async def read_tail(
    conn: AsyncConnection,
    segments: Sequence[Segment],
    suffices: Callable[[list[JournalEntry]], bool],
    *,
    first_page: int = FIRST_PAGE,
    max_page: int = MAX_PAGE,
) -> tuple[list[JournalEntry], bool]:
    """The newest entries of a thread, ascending, read backwards in keyset pages until
    `suffices(tail)` says older ones cannot matter. Returns (tail, complete): complete when it
    reaches the thread's first entry. Pages double, so a long walk stays a few round trips and
    reads at most about twice what it needs.
    """

    async def page_before(before: int | None, size: int) -> list[JournalEntry]:
        rows = await read_entries(conn, segments, before_seq=before, descending=True, limit=size)
        return [journal_entry(r) for r in reversed(rows)]

    return await _paged(page_before, suffices, first_page, max_page)


async def tail_from(
    newest: Newest, suffices: Callable[[list[JournalEntry]], bool]
) -> tuple[list[JournalEntry], bool] | None:
    """What read_tail would return, its pages taken from `newest` alone; None when it would
    read past them (the caller reads the thread then)."""

    async def page_before(before: int | None, size: int) -> list[JournalEntry]:
        older = [e for e in newest.entries if before is None or e.seq < before]
        if len(older) < size and not newest.reaches_start:
            raise _PastNewest
        return older[-size:]

    try:
        return await _paged(page_before, suffices, FIRST_PAGE, MAX_PAGE)
    except _PastNewest:
        return None


class _PastNewest(Exception):
    pass


async def _paged(
    page_before: Callable[[int | None, int], Awaitable[list[JournalEntry]]],
    suffices: Callable[[list[JournalEntry]], bool],
    first_page: int,
    max_page: int,
) -> tuple[list[JournalEntry], bool]:
    """read_tail's walk, over `page_before(seq, size)`: the `size` entries before `seq` (None:
    the newest), ascending."""
    tail: list[JournalEntry] = []
    page = first_page
    while True:
        rows = await page_before(tail[0].seq if tail else None, page)
        tail[:0] = rows
        if len(rows) < page:
            return tail, True
        if suffices(tail):
            return tail, False
        page = min(page * 2, max_page)


async def count_kind(conn: AsyncConnection, segments: Sequence[Segment], kind: str) -> int:
    """How many entries of `kind` the thread holds; meant for rare, indexed kinds (summaries)."""
    if not segments:  # an empty thread
        return 0
    # An empty thread (a new session) matches nothing; or_() with no clause is deprecated.
    in_thread = or_(false(), *(_in_segment(s, None, None) for s in segments))
    query = select(func.count()).select_from(entries).where(in_thread, entries.c.kind == kind)
    return int((await conn.execute(query)).scalar_one())


async def run_entries(
    conn: AsyncConnection, session_id: str, from_seq: int, run_id: str, *, tenant_id: str
) -> list[JournalEntry]:
    """The entries a run wrote, in order: they live in the session's own range, after its input;
    none if the session is not the tenant's."""
    params = {
        "session_id": session_id,
        "tenant_id": tenant_id,
        "from_seq": from_seq,
        "refs": {"run_id": run_id},
    }
    return [journal_entry(r) for r in (await conn.execute(_run_entries(), params)).mappings()]


@functools.cache  # built once: constructing it cost more CPU than running it
def _run_entries() -> Select[Any]:
    owned = select(sessions.c.id).where(
        sessions.c.id == bindparam("session_id"), sessions.c.tenant_id == bindparam("tenant_id")
    )
    return (
        select(*ENTRY_COLUMNS)
        .where(
            entries.c.session_id == bindparam("session_id"),
            entries.c.seq >= bindparam("from_seq"),
            entries.c.refs.contains(bindparam("refs", type_=entries.c.refs.type)),
            owned.exists(),
        )
        .order_by(entries.c.seq)
    )


async def search_entries(
    conn: AsyncConnection,
    segments: Sequence[Segment],
    query: str,
    *,
    kinds: Sequence[str] | None,
    limit: int,
) -> list[RowMapping]:
    """Entries of a thread matching a web-style query (`"exact phrase" or -not`), best first,
    each with a highlighted excerpt."""
    tsquery = func.websearch_to_tsquery("english", query)
    readable = func.coalesce(
        entries.c.payload["content"].astext,
        entries.c.payload["name"].astext + " " + entries.c.payload["arguments"].astext,
        text("payload::text"),
    )
    rank = func.ts_rank_cd(entries.c.search, tsquery).label("rank")
    excerpt = func.ts_headline("english", readable, tsquery, "MaxWords=35, MinWords=12").label(
        "excerpt"
    )
    # An empty thread (a new session) matches nothing; or_() with no clause is deprecated.
    in_thread = or_(false(), *(_in_segment(s, None, None) for s in segments))
    select_query = (
        select(entries.c.seq, entries.c.id, entries.c.kind, entries.c.created_at, rank, excerpt)
        .where(in_thread, entries.c.search.op("@@")(tsquery))
        .order_by(rank.desc(), entries.c.seq.desc())
        .limit(limit)
    )
    if kinds:
        select_query = select_query.where(entries.c.kind.in_(kinds))
    return list((await conn.execute(select_query)).mappings())
