"""Built-in tools, registered by name, and the executor every tool call goes through.

Errors and timeouts become results the model can read, never crashes of the run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from app.core.builtin_tools import SEARCH_LIMIT_MAX
from app.core.eviction import READ_TOOL_OUTPUT_DEFINITION
from app.core.mcp import SEPARATOR, McpServer
from app.core.tool_loop import PendingCall
from app.outbound import OutboundRefused, check_url
from app.services.search import search_history

# Re-exported: they are the registry's vocabulary (a tool function takes a ToolContext, execute
# returns a ToolOutcome), and the run loop and the tool modules name them from here.
from app.tools.context import ToolContext as ToolContext
from app.tools.context import ToolOutcome as ToolOutcome
from app.tools.mcp import call_tool
from app.tools.webhook import call_webhook

if TYPE_CHECKING:
    from app.config import Settings


ToolFunction = Callable[[dict[str, Any], ToolContext], Awaitable[Any]]
BUILTINS: dict[str, ToolFunction] = {}


def builtin(name: str) -> Callable[[ToolFunction], ToolFunction]:
    def register(function: ToolFunction) -> ToolFunction:
        BUILTINS[name] = function
        return function

    return register


async def execute(
    call: PendingCall,
    tools: Sequence[Mapping[str, Any]],
    context: ToolContext,
    *,
    settings: Settings | None = None,
    mcp_servers: Mapping[str, McpServer] | None = None,
) -> ToolOutcome:
    """Run one call of the model against the tools the run offered.

    `settings` gives webhook tools their signing secret and retries (None: unsigned, 2 retries)
    and what tool calls may reach (None: anywhere but metadata addresses); `mcp_servers`, the
    run's MCP servers by name (with their credentials: never part of a tool definition).
    """
    definition = next((t for t in tools if t.get("name") == call.name), None)
    if definition is None and call.name == READ_TOOL_OUTPUT_DEFINITION["name"]:
        # The projection offers read_tool_output on its own once it evicted an output, so a run
        # that never declared it can still call it; a declared definition of the name wins.
        definition = READ_TOOL_OUTPUT_DEFINITION
    if definition is None:
        return ToolOutcome(f"Error: there is no tool named {call.name!r}.", is_error=True)
    kind = definition.get("kind", "client")
    timeout = float(definition.get("timeout_seconds", 30))
    allowed = settings.outbound_allowed if settings else ["*"]
    if kind == "mcp":
        server_name, _, tool = call.name.partition(SEPARATOR)
        server = (mcp_servers or {}).get(server_name)
        if server is None:
            return ToolOutcome(f"Error: no MCP server offers {call.name!r}.", is_error=True)
        mcp_timeout = settings.mcp_timeout_seconds if settings else timeout
        return await call_tool(server, tool, call.arguments, allowed, seconds=mcp_timeout)
    if kind == "webhook":
        url = definition.get("url")
        if not url:
            return ToolOutcome(f"Error: the webhook tool {call.name} has no url.", is_error=True)
        try:
            await check_url(str(url), allowed)
        except OutboundRefused as exc:
            return ToolOutcome(f"Error: the webhook tool {call.name}: {exc}.", is_error=True)
        return await call_webhook(
            str(url),
            call,
            context,
            secret=settings.webhook_secret if settings else None,
            timeout=timeout,
            max_retries=settings.webhook_max_retries if settings else 2,
        )
    if kind != "builtin":
        return ToolOutcome(f"Error: {kind} tools are not available yet.", is_error=True)
    function = BUILTINS.get(call.name)
    if function is None:
        return ToolOutcome(f"Error: no built-in tool is called {call.name!r}.", is_error=True)
    try:
        return ToolOutcome(await asyncio.wait_for(function(call.arguments, context), timeout))
    except TimeoutError:
        return ToolOutcome(f"Error: {call.name} timed out after {timeout:g} s.", is_error=True)
    except Exception as exc:  # a failing tool is news for the model, not a crash of the run
        return ToolOutcome(f"Error: {call.name} failed: {exc}", is_error=True)


@builtin("current_time")
async def current_time(arguments: dict[str, Any], context: ToolContext) -> str:
    """The current date and time, UTC, ISO 8601."""
    return datetime.now(UTC).isoformat(timespec="seconds")


@builtin("search_history")
async def search_history_tool(
    arguments: dict[str, Any], context: ToolContext
) -> list[dict[str, Any]]:
    """Full-text search of the session's whole history: what compaction took out of the
    window is still found here."""
    if context.engine is None:
        raise RuntimeError("search_history needs the database")
    limit = max(1, min(int(arguments.get("limit", 5)), SEARCH_LIMIT_MAX))
    rows = await search_history(
        context.engine,
        context.tenant_id,
        context.session_id,
        str(arguments.get("query", "")),
        limit=limit,
    )
    return [{"seq": r["seq"], "kind": r["kind"], "excerpt": r["excerpt"]} for r in rows]
