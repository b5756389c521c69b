"""The memory built-ins: read_memory, write_memory, update_memory, on the session's namespace.

Offered automatically to sessions whose config names a `memory_namespace` (see
app.services.projection.offered_tools); the rules are app.services.memory's, as over HTTP.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from app.db import sessions as sessions_db
from app.services import memory as service
from app.services.errors import NotFound
from app.tools.registry import ToolContext, builtin


async def _target(context: ToolContext, tool: str) -> tuple[AsyncEngine, str]:
    """The engine, and the namespace the session's config names now (a config change applies
    at once)."""
    if context.engine is None:
        raise RuntimeError(f"{tool} needs the database")
    async with context.engine.connect() as conn:
        session = await sessions_db.get_session(
            conn, context.tenant_id, context.session_id, include_expired=True
        )
    namespace = session.config.memory_namespace if session is not None else None
    if not namespace:
        raise RuntimeError("this session has no memory: its config names no memory_namespace")
    return context.engine, namespace


@builtin("read_memory")
async def read_memory(arguments: dict[str, Any], context: ToolContext) -> str:
    """The whole memory, with its version."""
    engine, namespace = await _target(context, "read_memory")
    memory = await service.find_memory(engine, context.tenant_id, namespace)
    if memory is None or not memory.content:
        return f"Memory {namespace} is empty."
    return f"Memory {namespace} (version {memory.version}, {memory.lines} lines):\n{memory.content}"


@builtin("write_memory")
async def write_memory(arguments: dict[str, Any], context: ToolContext) -> str:
    """Replace the whole memory."""
    engine, namespace = await _target(context, "write_memory")
    content = arguments.get("content")
    if not isinstance(content, str):
        raise ValueError("content must be a string")
    memory = (await service.put_memory(engine, context.tenant_id, namespace, content)).memory
    return f"Memory {namespace} saved: version {memory.version}, {memory.lines} lines."


@builtin("update_memory")
async def update_memory(arguments: dict[str, Any], context: ToolContext) -> str:
    """Find and replace, with the rules of PATCH /v1/memory/{namespace}."""
    engine, namespace = await _target(context, "update_memory")
    old, new = arguments.get("old_string"), arguments.get("new_string")
    if not isinstance(old, str) or not isinstance(new, str):
        raise ValueError("old_string and new_string must be strings")
    try:
        written = await service.update_memory(
            engine,
            context.tenant_id,
            namespace,
            old,
            new,
            replace_all=bool(arguments.get("replace_all", False)),
        )
    except NotFound as exc:
        raise RuntimeError(f"memory {namespace} is empty: use write_memory first") from exc
    memory, count = written.memory, written.replacements
    return (
        f"Memory {namespace} updated: {count} replacement{'s' if count != 1 else ''}, "
        f"now version {memory.version}, {memory.lines} lines."
    )
