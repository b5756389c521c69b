"""The memory built-ins: read_memory, write_memory, update_memory, on the session's namespace.

Offered automatically to sessions whose config names a `memory_namespace` (see
app.services.projection.offered_tools); the rules are app.services.memory's, as over HTTP.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from app.core.memory import MAX_MEMORY_BYTES, MEMORY_LINES
from app.db import sessions as sessions_db
from app.services import memory as service
from app.services.errors import NotFound
from app.tools.registry import ToolContext, builtin

MEMORY_TOOLS: tuple[dict[str, Any], ...] = (
    {
        "name": "read_memory",
        "description": (
            "Read your whole persistent memory: notes that outlive this conversation. Its "
            f"first {MEMORY_LINES} lines are already in your instructions; read it when it is "
            "longer, or before rewriting it."
        ),
        "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
        "kind": "builtin",
    },
    {
        "name": "write_memory",
        "description": (
            "Replace your whole persistent memory with `content` (Markdown; at most "
            f"{MAX_MEMORY_BYTES // 1024} KiB). Keep what matters across conversations: facts "
            "about the user, decisions, preferences. To change part of it, use update_memory."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "content": {"type": "string", "description": "The new memory, in full."}
            },
            "required": ["content"],
            "additionalProperties": False,
        },
        "kind": "builtin",
    },
    {
        "name": "update_memory",
        "description": (
            "Find and replace in your persistent memory: `old_string` must occur exactly once "
            "(add surrounding text to make it unique) unless replace_all is true. An empty "
            "new_string deletes it."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "old_string": {"type": "string", "minLength": 1, "description": "Text to find."},
                "new_string": {"type": "string", "description": "Its replacement."},
                "replace_all": {
                    "type": "boolean",
                    "default": False,
                    "description": "Replace every occurrence.",
                },
            },
            "required": ["old_string", "new_string"],
            "additionalProperties": False,
        },
        "kind": "builtin",
    },
)


async def _target(context: ToolContext, tool: str) -> tuple[AsyncEngine, str]:
    """The engine, and the namespace the session's config names now (a config change applies
    at once)."""
    if context.engine is None:
        raise RuntimeError(f"{tool} needs the database")
    async with context.engine.connect() as conn:
        session = await sessions_db.get_session(conn, context.tenant_id, context.session_id)
    namespace = session["config"].get("memory_namespace") if session is not None else None
    if not namespace:
        raise RuntimeError("this session has no memory: its config names no memory_namespace")
    return context.engine, str(namespace)


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
