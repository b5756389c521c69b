"""Session files: export a session's thread as JSON Lines, import one as a new session."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Callable
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.config import Settings
from app.core.entries import NewEntry
from app.core.session_file import (
    EntryLine,
    FileProblem,
    Header,
    LineSplitter,
    LineTooLong,
    MemoryLine,
    SessionFields,
    ThreadCheck,
    check_header,
    encode,
    entry_line,
    header_line,
    parse_line,
)
from app.core.sessions import Session
from app.db import journal as journal_db
from app.db import memory as memory_db
from app.db import sessions as sessions_db
from app.db.engine import read_snapshot
from app.services import quotas
from app.services.errors import Invalid, Malformed, ServiceError, TooLarge
from app.services.journal import append_in
from app.services.memory import import_memory_in
from app.services.sessions import check_config

# Entries read per keyset page on export, and appended per statement batch on import: memory
# stays bounded by one page whatever the session's length.
PAGE = 500
# File problems the reader cannot even parse: the request is malformed (400), not merely invalid.
_MALFORMED = frozenset({"invalid_json", "invalid_unicode", "blank_line"})


async def export_lines(
    engine: AsyncEngine, tenant_id: str, session_id: str, *, memory: bool
) -> AsyncIterator[bytes]:
    """The session file, line by line, read on one snapshot (a concurrent append or a deletion
    of an ancestor cannot tear it) in keyset pages. The caller checked the session exists; if it
    is deleted before the snapshot, the file stops before its end line, so it reads as cut."""
    async with read_snapshot(engine) as conn:
        session = await sessions_db.get_session(conn, tenant_id, session_id)
        if session is None:
            return
        yield encode(header_line(_session_fields(session)))
        last = 0
        while last < session.rev:
            rows = await journal_db.read_entries(
                conn, session.thread, after_seq=last, before_seq=session.rev + 1, limit=PAGE
            )
            if not rows:
                return  # a hole in the thread: no end line, the file reads as cut
            for row in rows:
                yield encode(
                    entry_line(
                        int(row["seq"]),
                        str(row["id"]),
                        str(row["kind"]),
                        row["payload"],
                        row["refs"],
                        int(row["token_count"]),
                        row["created_at"],
                    )
                )
            last = int(rows[-1]["seq"])
        namespace = session.config.memory_namespace
        if memory and namespace is not None:
            found = await memory_db.get_memory(conn, tenant_id, namespace)
            if found is not None:
                yield encode(
                    {"type": "memory", "namespace": namespace, "content": found["content"]}
                )
        yield encode({"type": "end", "entries": last})


def _session_fields(session: Session) -> dict[str, Any]:
    fork = (
        {"session_id": session.parent_id, "fork_seq": session.fork_seq}
        if session.parent_id is not None
        else None
    )
    return SessionFields.model_validate(
        {
            "title": session.title,
            "metadata": session.metadata,
            # Resolved: the file runs the same anywhere, whether or not the agent exists there.
            "config": session.config.as_json(),
            "agent": session.agent.name if session.agent is not None else None,
            "agent_version": session.agent.version if session.agent is not None else None,
            "fork_origin": fork,
        }
    ).model_dump(mode="json", exclude={"token_total"})


async def import_session(
    engine: AsyncEngine,
    tenant_id: str,
    chunks: AsyncIterable[bytes],
    *,
    settings: Settings,
    check_fields: Callable[[SessionFields], SessionFields],
) -> Session:
    """A new session of this tenant holding the file's thread, all or nothing (one
    transaction). Every entry is validated by the journal's append path, as an append would be;
    entry ids, seqs, kinds, payloads, refs and times are kept (ids are unique per session, so
    they cannot collide with another session's). `check_fields` validates the session's own
    fields as a create request's (the API's schema). The thread's tool call ids are the only
    thing held besides one batch of entries."""
    lines = _parsed_lines(chunks)
    try:
        first = await anext(lines, None)
        if first is None:
            raise FileProblem("empty_file", "the file is empty", 0)
        header = check_header(first[1])
        fields = check_fields(header.session)
        check_config(settings, fields.config)
        async with engine.begin() as conn:
            await quotas.check_new_session(conn, settings, tenant_id)
            session = await sessions_db.insert_session(
                conn,
                tenant_id=tenant_id,
                title=fields.title,
                metadata=fields.metadata,
                config=fields.config,
                expires_at=sessions_db.tenant_default_expiry(tenant_id),
            )
            await _import_lines(conn, tenant_id, session.id, header, lines)
            found = await sessions_db.get_session(conn, tenant_id, session.id)
            assert found is not None
            return found
    except LineTooLong as problem:
        raise TooLarge(problem.code, problem.message, problem.details) from None
    except FileProblem as problem:
        error = Malformed if problem.code in _MALFORMED else Invalid
        raise error(problem.code, problem.message, problem.details) from None


async def _parsed_lines(
    chunks: AsyncIterable[bytes],
) -> AsyncIterator[tuple[int, Header | EntryLine | MemoryLine | Any]]:
    splitter = LineSplitter()
    async for chunk in chunks:
        for raw in splitter.feed(chunk):
            yield splitter.line_no, parse_line(raw, splitter.line_no)
    for raw in splitter.rest():
        try:
            parsed = parse_line(raw, splitter.line_no)
        except FileProblem as problem:
            if problem.code != "invalid_json":
                raise
            # A last line without its newline that is not JSON: the file was cut mid-line.
            raise FileProblem(
                "truncated",
                f"the file ends in the middle of line {splitter.line_no}: it was cut short",
                splitter.line_no,
            ) from None
        yield splitter.line_no, parsed


async def _import_lines(
    conn: AsyncConnection,
    tenant_id: str,
    session_id: str,
    header: Header,
    lines: AsyncIterator[tuple[int, Any]],
) -> None:
    check = ThreadCheck()
    batch: list[tuple[int, EntryLine]] = []
    line_no = 1
    async for line_no, line in lines:
        check.accept(line, line_no)
        if isinstance(line, EntryLine):
            batch.append((line_no, line))
            if len(batch) == PAGE:
                await _append_batch(conn, tenant_id, session_id, batch)
                batch = []
        elif isinstance(line, MemoryLine):
            await import_memory_in(conn, tenant_id, line.namespace, line.content)
    check.finish(line_no)
    if batch:
        await _append_batch(conn, tenant_id, session_id, batch)


async def _append_batch(
    conn: AsyncConnection, tenant_id: str, session_id: str, batch: list[tuple[int, EntryLine]]
) -> None:
    """Append through the journal's own path: its validation of payloads, content, refs and
    ranges; errors name the file's lines."""
    entries = [
        NewEntry(line.kind, line.payload, line.refs, id=line.id, created_at=line.created_at)
        for _, line in batch
    ]
    try:
        # Nothing can be stored under a session this transaction has just made but this file's
        # earlier batches: the replay lookup is skipped, the unique index refuses a repeated id.
        await append_in(
            conn, tenant_id, session_id, entries, fresh_ids=True, expected_rev=batch[0][1].seq - 1
        )
    except ServiceError as error:
        raise _on_lines(error, [n for n, _ in batch]) from None
    except IntegrityError as error:
        if "entries_session_entry_id" not in str(error.orig):
            raise
        raise Invalid(
            "duplicate_entry_id",
            f"an entry id between lines {batch[0][0]} and {batch[-1][0]} is used twice in the file",
            {"lines": [batch[0][0], batch[-1][0]]},
        ) from None


def _on_lines(error: ServiceError, line_numbers: list[int]) -> ServiceError:
    """The append's error, each of its entry errors located by the file's line."""
    errors = error.details.get("errors")
    if not isinstance(errors, list) or not errors:
        return error
    located = []
    for item in errors:
        loc = list(item.get("loc", []))
        if len(loc) >= 2 and loc[0] == "entries" and isinstance(loc[1], int):
            item = {**item, "line": line_numbers[loc[1]], "loc": loc[2:]}
        located.append(item)
    first = located[0]
    where = ".".join(str(p) for p in first["loc"])
    message = f"line {first.get('line')}: {where}: {first['msg']}"
    return type(error)(error.code, message, {**error.details, "errors": located})
