"""Memory use cases: read, list, create/replace, find/replace, delete, with ETag preconditions.

The one home of memory's rules: the HTTP routes and the built-in tools both come here.
A memory's ETag is strong and names its version and its incarnation ("v3-<generation>", the
generation derived from its created_at): every write adds 1 to the version, and a memory deleted
and created again starts over at version 1 under a new generation, so no ETag of the old memory
ever matches the new one. Preconditions are checked against the row locked FOR UPDATE, in the
transaction that writes it, so two writers holding the same ETag can never both succeed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.core.memory import (
    MAX_MEMORY_BYTES,
    NAMESPACE_PATTERN,
    AmbiguousMatch,
    NoMatch,
    ReplacementTooLarge,
    find_replace,
    memory_lines,
)
from app.db import memory as memory_db
from app.services.errors import Conflict, Invalid, NotFound, PreconditionFailed

_NAMESPACE = re.compile(NAMESPACE_PATTERN)


@dataclass(frozen=True)
class Memory:
    namespace: str
    content: str
    version: int
    created_at: datetime
    updated_at: datetime

    @property
    def etag(self) -> str:
        return etag(self)

    @property
    def bytes(self) -> int:
        return len(self.content.encode())

    @property
    def lines(self) -> int:
        return len(memory_lines(self.content))

    @classmethod
    def from_row(cls, row: RowMapping) -> Memory:
        return cls(
            row["namespace"], row["content"], row["version"], row["created_at"], row["updated_at"]
        )


@dataclass(frozen=True)
class Written:
    memory: Memory
    created: bool  # a PUT that created the namespace (201), rather than replaced it
    replacements: int = 0  # a find/replace: occurrences replaced


@dataclass(frozen=True)
class MemoryPage:
    items: list[RowMapping]  # namespace, version, bytes, lines, created_at, updated_at
    next_cursor: str | None


def etag(memory: Memory | RowMapping | Mapping[str, Any]) -> str:
    """The strong ETag of a memory (or of its row, which has version and created_at):
    `"v<version>-<generation>"`. The generation is the creation time in microseconds since the
    epoch, in base 36: a memory deleted and created again gets a new one, so an ETag of the
    earlier memory never matches the later one, though their versions restart alike at 1."""
    if isinstance(memory, Memory):
        version, created_at = memory.version, memory.created_at
    else:
        version, created_at = memory["version"], memory["created_at"]
    return f'"v{version}-{_generation(created_at)}"'


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"


def _generation(created_at: datetime) -> str:
    """Microseconds since the epoch in base 36, computed exactly (no float rounding)."""
    if created_at.tzinfo is None:
        created_at = created_at.replace(tzinfo=UTC)
    delta = created_at - _EPOCH
    micros = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    sign, micros = ("-", -micros) if micros < 0 else ("", micros)
    digits = ""
    while True:
        micros, digit = divmod(micros, 36)
        digits = _DIGITS[digit] + digits
        if micros == 0:
            return sign + digits


def memory_not_found(namespace: str) -> NotFound:
    return NotFound("memory_not_found", f"no memory {namespace}", {"namespace": namespace})


async def get_memory(engine: AsyncEngine, tenant_id: str, namespace: str) -> Memory:
    _check_namespace(namespace)
    async with engine.connect() as conn:
        row = await memory_db.get_memory(conn, tenant_id, namespace)
    if row is None:
        raise memory_not_found(namespace)
    return Memory.from_row(row)


async def find_memory(engine: AsyncEngine, tenant_id: str, namespace: str) -> Memory | None:
    """The memory, or None when the namespace holds none yet."""
    _check_namespace(namespace)
    async with engine.connect() as conn:
        row = await memory_db.get_memory(conn, tenant_id, namespace)
    return Memory.from_row(row) if row is not None else None


async def list_memories(
    engine: AsyncEngine,
    tenant_id: str,
    *,
    limit: int,
    cursor: str | None = None,
    prefix: str | None = None,
) -> MemoryPage:
    """Namespaces in byte order; `cursor` is the previous page's `next_cursor`."""
    async with engine.connect() as conn:
        rows = await memory_db.list_memories(
            conn, tenant_id, limit=limit + 1, after=cursor, prefix=prefix
        )
    more = len(rows) > limit
    rows = rows[:limit]
    return MemoryPage(rows, rows[-1]["namespace"] if more else None)


async def put_memory(
    engine: AsyncEngine,
    tenant_id: str,
    namespace: str,
    content: str,
    *,
    if_match: str | None = None,
    if_none_match: str | None = None,
) -> Written:
    """Create or replace. `If-Match`: only if the current ETag is one of these (`*`: if it
    exists); `If-None-Match: *`: only if it does not exist yet (an ETag list: only if the
    current one is none of them). A failed condition is 412 with the current ETag."""
    _check_namespace(namespace)
    _check_size(content)
    async with engine.begin() as conn:
        current = await memory_db.get_memory(conn, tenant_id, namespace, lock=True)
        _check_preconditions(namespace, current, if_match, if_none_match)
        # Unconditional: an upsert, so that two first writes cannot collide. Conditional: the
        # checked version (0 = create only; a concurrent create then makes this one fail).
        conditional = if_match is not None or if_none_match is not None
        expected = (current["version"] if current is not None else 0) if conditional else None
        row = await memory_db.put_memory(
            conn, tenant_id, namespace, content, expected_version=expected
        )
    if row is None:
        raise await _lost_create(engine, tenant_id, namespace, if_none_match or "*")
    return Written(Memory.from_row(row), created=row["version"] == 1)


async def update_memory(
    engine: AsyncEngine,
    tenant_id: str,
    namespace: str,
    old_string: str,
    new_string: str,
    *,
    replace_all: bool = False,
    if_match: str | None = None,
) -> Written:
    """Find and replace in an existing memory: old_string must occur exactly once (or
    replace_all); 422 no_match / ambiguous_match otherwise, and nothing is written."""
    _check_namespace(namespace)
    async with engine.begin() as conn:
        current = await memory_db.get_memory(conn, tenant_id, namespace, lock=True)
        if current is None:
            raise memory_not_found(namespace)
        _check_preconditions(namespace, current, if_match, None)
        try:
            replaced = find_replace(
                current["content"],
                old_string,
                new_string,
                replace_all=replace_all,
                max_bytes=MAX_MEMORY_BYTES,
            )
        except ReplacementTooLarge as exc:
            raise _too_large(exc.size) from exc
        except AmbiguousMatch as exc:
            raise Invalid(
                "ambiguous_match", str(exc), {"namespace": namespace, "count": exc.count}
            ) from exc
        except NoMatch as exc:
            raise Invalid("no_match", str(exc), {"namespace": namespace}) from exc
        except ValueError as exc:
            raise Invalid("empty_old_string", str(exc), {"namespace": namespace}) from exc
        _check_size(replaced.content)
        # The row is locked: the version just checked is still the current one.
        row = await memory_db.put_memory(
            conn,
            tenant_id,
            namespace,
            replaced.content,
            expected_version=int(current["version"]),
        )
        assert row is not None
    return Written(Memory.from_row(row), created=False, replacements=replaced.count)


async def delete_memory(
    engine: AsyncEngine, tenant_id: str, namespace: str, *, if_match: str | None = None
) -> None:
    _check_namespace(namespace)
    async with engine.begin() as conn:
        current = await memory_db.get_memory(conn, tenant_id, namespace, lock=True)
        if current is None:
            raise memory_not_found(namespace)
        _check_preconditions(namespace, current, if_match, None)
        await memory_db.delete_memory(conn, tenant_id, namespace)


async def import_memory_in(
    conn: AsyncConnection, tenant_id: str, namespace: str, content: str
) -> None:
    """Create a memory an imported session file carries, in the import's transaction. The same
    content already there is fine; other content is a conflict (409): an import never
    overwrites what the tenant's other sessions remember."""
    _check_namespace(namespace)
    _check_size(content)
    current = await memory_db.get_memory(conn, tenant_id, namespace, lock=True)
    if current is None:
        created = await memory_db.put_memory(
            conn, tenant_id, namespace, content, expected_version=0
        )
        if created is not None:
            return
    if current is None or current["content"] != content:  # other content, or created meanwhile
        raise Conflict(
            "memory_conflict",
            f"memory {namespace!r} already exists with other content: import without it, or "
            "delete or rename it first",
            {"namespace": namespace},
        )


def _check_namespace(namespace: str) -> None:
    if not _NAMESPACE.match(namespace):
        raise Invalid(
            "invalid_namespace",
            f"a memory namespace must match {NAMESPACE_PATTERN}",
            {"namespace": namespace, "pattern": NAMESPACE_PATTERN},
        )


def _check_size(content: str) -> None:
    try:
        size = len(content.encode())
    except UnicodeEncodeError as exc:  # a lone surrogate: not storable text
        raise Invalid("invalid_unicode", f"the content is not valid Unicode: {exc.reason}") from exc
    if size > MAX_MEMORY_BYTES:
        raise _too_large(size)


def _too_large(size: int) -> Invalid:
    return Invalid(
        "memory_too_large",
        f"a memory may hold at most {MAX_MEMORY_BYTES} bytes of UTF-8; this one would hold {size}",
        {"limit_bytes": MAX_MEMORY_BYTES, "bytes": size},
    )


def _check_preconditions(
    namespace: str, current: RowMapping | None, if_match: str | None, if_none_match: str | None
) -> None:
    """RFC 9110 §13.1: If-Match compares strongly, If-None-Match weakly; `*` is any version."""
    tag = etag(current) if current is not None else None
    if if_match is not None:
        tags = _tags(if_match)
        if tag is None or not ("*" in tags or tag in tags):
            raise _failed(namespace, current, "If-Match", if_match)
    if if_none_match is not None:
        tags = {t.removeprefix("W/") for t in _tags(if_none_match)}
        if tag is not None and ("*" in tags or tag in tags):
            raise _failed(namespace, current, "If-None-Match", if_none_match)


def _tags(header: str) -> set[str]:
    return {t.strip() for t in header.split(",") if t.strip()}


def _failed(
    namespace: str, current: RowMapping | None, header: str, value: str
) -> PreconditionFailed:
    tag = etag(current) if current is not None else None
    reason = "the memory does not exist" if current is None else f"its ETag is now {tag}"
    return PreconditionFailed(
        "precondition_failed",
        f"{header}: {value} does not hold for memory {namespace}: {reason}",
        {
            "namespace": namespace,
            "etag": tag,
            "version": current["version"] if current is not None else None,
        },
    )


async def _lost_create(
    engine: AsyncEngine, tenant_id: str, namespace: str, if_none_match: str
) -> PreconditionFailed:
    """A create-only write lost the race to a concurrent create: report that one's ETag."""
    async with engine.connect() as conn:
        current = await memory_db.get_memory(conn, tenant_id, namespace)
    return _failed(namespace, current, "If-None-Match", if_none_match)
