"""The built-in `read_tool_output`: pages of a tool output the projection evicted.

The projection shows an output over the policy's threshold as a preview naming a reference
(`tool_output:<seq>`); the output itself stays in the journal, and this reads it back from the
session's thread (across fork lineage, so a fork reads what its parent's tools returned).
"""

from __future__ import annotations

from typing import Any

from app.core.entries import EntryKind
from app.core.eviction import MAX_PAGE_CHARS, PAGE_CHARS, READ_TOOL_OUTPUT, page, parse_ref
from app.core.messages import result_text
from app.db import journal as journal_db
from app.db import sessions as sessions_db
from app.db.engine import read_snapshot
from app.tools.registry import ToolContext, builtin


@builtin(READ_TOOL_OUTPUT.name)
async def read_tool_output(arguments: dict[str, Any], context: ToolContext) -> dict[str, Any]:
    """{ref, offset, limit, total_chars, next_offset, content}: `limit` characters of the
    output from `offset`. Errors (a bad reference, an entry that is no tool output) are raised
    and become error results the model reads."""
    if context.engine is None:
        raise RuntimeError("read_tool_output needs the database")
    ref = str(arguments.get("ref", ""))
    seq = parse_ref(ref)
    if seq is None:
        raise ValueError(f"{ref!r} is not a tool output reference (tool_output:<seq>)")
    offset = _integer(arguments, "offset", 0, 0, None)
    limit = _integer(arguments, "limit", PAGE_CHARS, 1, MAX_PAGE_CHARS)
    async with read_snapshot(context.engine) as conn:
        session = await sessions_db.get_session(
            conn, context.tenant_id, context.session_id, include_expired=True
        )
        if session is None:
            raise LookupError("this session was not found")
        thread = session.thread
        rows = await journal_db.read_entries(
            conn, thread, after_seq=seq - 1, before_seq=seq + 1, limit=1
        )
    if not rows:
        raise LookupError(f"there is no entry {ref} in this session")
    if rows[0]["kind"] != EntryKind.TOOL_RESULT:
        raise ValueError(f"{ref} is a {rows[0]['kind']} entry, not a tool output")
    return page(result_text(rows[0]["payload"].get("content")), ref, offset, limit)


def _integer(arguments: dict[str, Any], name: str, default: int, low: int, high: int | None) -> int:
    """An integer argument within bounds; whole numbers written as strings or floats pass."""
    value = arguments.get(name, default)
    if value is None:
        return default
    try:
        number = int(value) if not isinstance(value, bool) else None
    except (TypeError, ValueError):
        number = None
    if number is None or (number != value and str(number) != str(value).strip()):
        raise ValueError(f"{name} must be an integer, not {value!r}")
    if number < low or (high is not None and number > high):
        bound = f"from {low} to {high}" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be {bound}, not {number}")
    return number
