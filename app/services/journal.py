"""Journal use cases: append entries (optimistic rev, idempotent ids) and read history pages."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import Insert, RowMapping
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.core.entries import (
    RANGE_KINDS,
    EntryKind,
    NewEntry,
    PayloadError,
    normalize_entry,
    range_errors,
)
from app.core.lineage import segments
from app.core.messages import text_of
from app.core.projection import RolledBack, rolled_back
from app.core.tokens import entry_tokens
from app.db import journal as journal_db
from app.db import sessions as sessions_db
from app.db.engine import read_snapshot
from app.db.sessions import RunEnded
from app.llm.tokenizers import stored_counter
from app.services.errors import Conflict, Invalid, entries_refused, session_not_found
from app.telemetry import metrics

# A concurrent append of the same entry id loses the unique-index race at most once; the retry
# then finds the id and answers with the original seq.
_APPEND_ATTEMPTS = 3


@dataclass(frozen=True)
class AppendResult:
    entries: list[RowMapping]
    rev: int
    replayed: bool  # True: every id was already in the thread, nothing was written


@dataclass(frozen=True)
class HistoryPage:
    entries: list[RowMapping]
    has_more: bool
    rev: int


async def append_entries(
    engine: AsyncEngine,
    tenant_id: str,
    session_id: str,
    new_entries: Sequence[NewEntry],
    *,
    expected_rev: int | None,
) -> AppendResult:
    """Append entries atomically at rev+1.., or not at all.

    With `expected_rev`, the append happens only if the session is still at that rev (409 with
    the current rev otherwise). Entries whose client ids are already in the thread make the call
    a replay: nothing is written and the original seqs come back.
    """
    # Tokenizing is CPU work: a large batch goes to a thread rather than stall the event loop.
    size = sum(len(str(e.payload)) for e in new_entries)
    rows = (
        await asyncio.to_thread(_prepare, new_entries) if size > 65_536 else _prepare(new_entries)
    )
    for _ in range(_APPEND_ATTEMPTS):
        try:
            async with engine.begin() as conn:
                return await _append_rows(
                    conn, tenant_id, session_id, rows, expected_rev, include_expired=False
                )
        except IntegrityError as exc:
            if "entries_session_entry_id" not in str(exc.orig):
                raise
    raise Conflict("append_conflict", "concurrent appends kept colliding; retry", {})


async def append_in(
    conn: AsyncConnection,
    tenant_id: str,
    session_id: str,
    new_entries: Sequence[NewEntry],
    *,
    fresh_ids: bool = False,
    session_values: Mapping[str, Any] | None = None,
    ended: RunEnded | None = None,
    expected_rev: int | None = None,
) -> AppendResult:
    """Append inside the caller's transaction (a use case writing entries with other rows: it
    checked the session, or a run under way writes, which a session's expiry does not stop).

    Entries with ids already in the thread make it a replay, as for append_entries. With
    `fresh_ids`, the caller vouches that no id can be stored yet (derived from an id it has just
    made up): the replay lookup, two statements, is skipped. The unique index still refuses a
    duplicate. `session_values`: more of the session's columns (its status, its totals), set
    with its rev (no statement of their own; not on a replay, which writes nothing); `ended`,
    at a run's end, its status and totals (app/db/sessions.RunEnded), as well.
    `expected_rev`: as for append_entries.
    """
    rows = _prepare(new_entries)
    return await _append_rows(
        conn,
        tenant_id,
        session_id,
        rows,
        expected_rev,
        fresh_ids=fresh_ids,
        include_expired=True,
        session_values=session_values,
        ended=ended,
    )


@metrics.timed_append
async def _append_rows(
    conn: AsyncConnection,
    tenant_id: str,
    session_id: str,
    rows: list[dict[str, Any]],
    expected_rev: int | None,
    *,
    fresh_ids: bool = False,
    include_expired: bool,
    session_values: Mapping[str, Any] | None = None,
    ended: RunEnded | None = None,
) -> AppendResult:
    client_ids = [r["id"] for r in rows if r["client_id"]]
    if client_ids and not fresh_ids:
        replay = await _find_replay(conn, tenant_id, session_id, rows, client_ids, include_expired)
        if replay is not None:
            return replay
    # Without client ids the common path is one statement: reserve the seqs, and insert the
    # entries at them; unless one names a range (checked once its seq is known, before any
    # insert) or keeps its time (an import): then two.
    advance = sessions_db.advancing(
        tenant_id,
        session_id,
        len(rows),
        expected_rev,
        include_expired,
        session_values,
        title=untitled_title(rows),
        ended=ended,
    )
    if rows and not any(r["kind"] in RANGE_KINDS or "created_at" in r for r in rows):
        inserted = await journal_db.insert_advancing(conn, advance, session_id, _stored(rows))
        rev = int(inserted[-1]["seq"]) if inserted else None
    else:
        inserted, rev = [], (await conn.execute(advance.statement, advance.params)).scalar()
    if rev is None:
        current = await sessions_db.current_rev(conn, tenant_id, session_id, include_expired)
        if current is None:
            raise session_not_found(session_id)
        raise Conflict(
            "rev_conflict",
            f"the session is at rev {current}, not {expected_rev}",
            {"current_rev": current, "expected_rev": expected_rev},
        )
    first = rev - len(rows) + 1
    # Only now is each entry's seq known. Raising rolls the transaction back, rev included: a
    # batch with one bad range writes nothing.
    errors = [
        {**e, "loc": ["entries", i, *e["loc"]]}
        for i, r in enumerate(rows)
        for e in range_errors(r["kind"], r["payload"], first + i)
    ]
    if errors:
        raise Invalid(
            "invalid_entries", "some entries refer to entries that do not exist", {"errors": errors}
        )
    if inserted or not rows:
        return AppendResult(inserted, rev, replayed=False)
    stored = await journal_db.insert_entries(
        conn, session_id, [r | {"seq": first + i} for i, r in enumerate(_stored(rows))]
    )
    return AppendResult(stored, rev, replayed=False)


def fresh_rows(new_entries: Sequence[NewEntry]) -> list[dict[str, Any]] | None:
    """A batch of entries whose ids no stored entry can have (derived from an id just made up),
    validated, as the entries table takes them, for a statement that appends them with more
    (an ask's, with its run: app/db/runs.insert_asked_run); None when the batch needs
    append_in's checks (an entry naming a range, checked once its seq is known; a kept time)."""
    rows = _prepare(new_entries)
    if any(r["kind"] in RANGE_KINDS or "created_at" in r for r in rows):
        return None
    return _stored(rows)


@dataclass(frozen=True)
class AppendPart:
    """An append made by a statement of its caller's (app/db/journal.advancing_insert): the
    rows it stores, in order, and the statement's part and parameters."""

    rows: list[dict[str, Any]]
    statement: Insert
    params: dict[str, Any]


def fresh_append(
    tenant_id: str,
    session_id: str,
    new_entries: Sequence[NewEntry],
    ended: RunEnded,
    as_read: int | None = None,
) -> AppendPart | None:
    """append_in(fresh_ids=True, ended=ended) as a part of another statement (a run's end: in
    its run's end statement); None when the entries need append_in's checks (fresh_rows).
    `as_read`: appended only if the session's row is still that version (sessions_db.
    advancing's)."""
    rows = fresh_rows(new_entries)
    if rows is None:
        return None
    advance = sessions_db.advancing(
        tenant_id,
        session_id,
        len(rows),
        None,
        True,
        title=untitled_title(rows),
        ended=ended,
        as_read=as_read,
    )
    return AppendPart(rows, *journal_db.advancing_insert(advance, session_id, rows))


def _stored(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows as the entries table takes them (client_id only decided the replay check)."""
    return [{k: v for k, v in r.items() if k != "client_id"} for r in rows]


# A title made from a message is cut at a word boundary near this many characters.
TITLE_CHARS = 60


def untitled_title(rows: Sequence[Mapping[str, Any]]) -> str | None:
    """The title an untitled session takes when these entries are appended: the text of the
    first user message among them, on one line and cut short (its first user message commits
    with it, so the session is named from it, on every path: asks, appends, the AI SDK chat,
    the OpenAI API). Set in the append's own rev update, where the title is still null."""
    for row in rows:
        payload = row["payload"]
        if row["kind"] != EntryKind.MESSAGE or payload.get("role") != "user":
            continue
        words = " ".join(text_of(payload.get("content") or "").split())
        if not words:
            continue  # an image alone: a later message may name it
        if len(words) <= TITLE_CHARS:
            return words
        head = words[: TITLE_CHARS + 1]
        cut = head.rsplit(" ", 1)[0] if " " in head else words[:TITLE_CHARS]
        return cut.rstrip(" ,.;:") + "…"
    return None


async def read_history(
    engine: AsyncEngine,
    tenant_id: str,
    session_id: str,
    *,
    after_seq: int | None,
    before_seq: int | None,
    limit: int,
    kinds: Sequence[str] | None,
    order: Literal["asc", "desc"],
) -> HistoryPage:
    async with read_snapshot(engine) as conn:
        session = await sessions_db.get_session(conn, tenant_id, session_id)
        if session is None:
            raise session_not_found(session_id)
        thread = session.thread
        found = await journal_db.read_entries(
            conn,
            thread,
            after_seq=after_seq,
            before_seq=before_seq,
            kinds=kinds,
            descending=order == "desc",
            limit=limit + 1,
        )
    return HistoryPage(found[:limit], len(found) > limit, session.rev)


HISTORY_PAGE = 1000  # entries read per page when reading a whole history


async def read_all(
    engine: AsyncEngine, tenant_id: str, session_id: str, kinds: Sequence[str]
) -> tuple[list[RowMapping], int]:
    """Every entry of `kinds`, oldest first, page by page, and the rev the last page was read at."""
    rows: list[RowMapping] = []
    after: int | None = None
    while True:
        page = await read_history(
            engine,
            tenant_id,
            session_id,
            after_seq=after,
            before_seq=None,
            limit=HISTORY_PAGE,
            kinds=kinds,
            order="asc",
        )
        rows += page.entries
        if not page.has_more:
            return rows, page.rev
        after = int(page.entries[-1]["seq"])


async def rolled_back_in(engine: AsyncEngine, tenant_id: str, session_id: str) -> RolledBack:
    """What the session's rollbacks took out of its conversation."""
    rows, _ = await read_all(engine, tenant_id, session_id, [str(EntryKind.ROLLBACK)])
    return rolled_back([journal_db.journal_entry(r) for r in rows])


async def live_entries(
    engine: AsyncEngine, tenant_id: str, session_id: str, kinds: Sequence[str]
) -> tuple[list[RowMapping], int]:
    """The session's entries of `kinds` that no rollback took out, oldest first, and the rev
    they were read at (rollbacks read in the same pages, so none appended meanwhile is missed
    before that rev)."""
    rows, rev = await read_all(engine, tenant_id, session_id, [*kinds, str(EntryKind.ROLLBACK)])
    removed = rolled_back([journal_db.journal_entry(r) for r in rows])
    live = [r for r in rows if r["kind"] != EntryKind.ROLLBACK and int(r["seq"]) not in removed]
    return live, rev


def _prepare(new_entries: Sequence[NewEntry]) -> list[dict[str, Any]]:
    """Validate and canonicalize a batch; count tokens once, here, for the entry's lifetime."""
    errors: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    counter = stored_counter()
    for index, entry in enumerate(new_entries):
        if entry.id is not None:
            if entry.id in seen:
                errors.append(
                    {
                        "loc": ["entries", index, "id"],
                        "msg": "duplicate id in batch",
                        "type": "duplicate",
                    }
                )
            seen.add(entry.id)
        try:
            payload, refs = normalize_entry(entry.kind, entry.payload, entry.refs)
        except PayloadError as exc:
            errors += [{**e, "loc": ["entries", index, *e["loc"]]} for e in exc.errors]
            continue
        row = {
            "id": entry.id or str(uuid.uuid4()),
            "client_id": entry.id is not None,
            "kind": str(entry.kind),
            "payload": payload,
            "refs": refs,
            "token_count": entry_tokens(entry.kind, payload, refs, counter),
        }
        if entry.created_at is not None:
            row["created_at"] = entry.created_at
        rows.append(row)
    if errors:
        raise entries_refused(errors)
    return rows


async def _find_replay(
    conn: AsyncConnection,
    tenant_id: str,
    session_id: str,
    rows: list[dict[str, Any]],
    client_ids: list[str],
    include_expired: bool,
) -> AppendResult | None:
    """The original result if this batch was appended before, None if it is new.

    A batch is appended atomically at consecutive seqs, so the stored entries of the client ids
    locate the whole original batch; it is a replay only if every entry there (with or without
    an id) matches what was sent now. Anything else reusing those ids is a conflict.
    """
    session = await sessions_db.get_session(
        conn, tenant_id, session_id, include_expired=include_expired
    )
    if session is None:
        raise session_not_found(session_id)
    thread = segments(session.id, session.lineage)
    existing = await journal_db.find_by_entry_ids(conn, thread, client_ids)
    if not existing:
        return None
    position = {r["id"]: i for i, r in enumerate(rows)}
    starts = {int(e["seq"]) - position[str(e["id"])] for e in existing}
    original: list[RowMapping] = []
    if len(existing) == len(client_ids) and len(starts) == 1:
        first = starts.pop()
        original = await journal_db.read_entries(
            conn, thread, after_seq=first - 1, before_seq=first + len(rows), limit=len(rows)
        )
    client_id_set = set(client_ids)
    same = len(original) == len(rows) and all(
        (o["kind"], o["payload"], o["refs"]) == (r["kind"], r["payload"], r["refs"])
        and (r["id"] not in client_id_set or o["id"] == r["id"])
        for o, r in zip(original, rows, strict=False)
    )
    if not same:
        raise Conflict(
            "entry_id_conflict",
            "entry ids already in the session were sent in a batch that differs from theirs",
            {"existing": {str(e["id"]): int(e["seq"]) for e in existing}},
        )
    return AppendResult(original, session.rev, replayed=True)
