"""MCP tools: a remote server's tool list (namespaced, schemas checked) and its tool calls.

A run lists each attached server's tools once (a list is reused for `mcp_tools_ttl_seconds`,
and dropped sooner when the server sends `notifications/tools/list_changed`); each tool is
offered as `<server>__<tool>`, so two servers' tools never collide with each other nor with a
built-in (no built-in name holds `__`, and a server name cannot). A tool whose input schema is
no valid JSON Schema object is left out with a warning. Every call opens its own connection
(no state outlives it), bounded by the timeout; a server that is down, slow or answers garbage
is an error result the model reads. Every request the MCP client sends is checked against
`outbound_allowed` first (app/outbound.py), a redirect's included.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx2
import jsonschema_rs
import mcp_types
from mcp.client.client import Client
from mcp.client.session import IncomingMessage
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client

from app.core.approvals import ApprovalRule
from app.core.mcp import McpServer, approval_rule, tool_name
from app.outbound import OutboundRefused, check_url
from app.tools.context import ToolOutcome

# A text result lands in the journal: longer ones are cut (and the projection evicts what is
# still large, as for any tool output).
MAX_RESULT_CHARS = 262_144
# What one message from a server may weigh before it is cut down to the above (a 1 MB result
# in its JSON-RPC envelope is more than the SDK's default limit of 1 MiB).
MAX_MESSAGE_BYTES = 8 * 1_048_576


@dataclass(frozen=True)
class Listing:
    """The tool definitions a run offers from its servers, and why some were left out."""

    tools: list[dict[str, Any]]
    warnings: list[str]
    # The approval rule of each offered tool whose server says (`require_approval`)
    approvals: dict[str, ApprovalRule] = field(default_factory=dict)


class _Cache:
    """Tool lists by server identity (URL and credentials), each with its expiry."""

    def __init__(self) -> None:
        self.lists: dict[str, tuple[float, list[mcp_types.Tool]]] = {}

    def get(self, key: str) -> list[mcp_types.Tool] | None:
        hit = self.lists.get(key)
        if hit is None or hit[0] <= time.monotonic():
            return None
        return hit[1]

    def put(self, key: str, tools: list[mcp_types.Tool], ttl: float) -> None:
        self.lists[key] = (time.monotonic() + ttl, tools)

    def drop(self, key: str) -> None:
        self.lists.pop(key, None)


CACHE = _Cache()


def _guard(allowed: Sequence[str]) -> Any:
    async def check(request: httpx2.Request) -> None:
        try:
            await check_url(str(request.url), allowed)
        except OutboundRefused as exc:
            raise httpx2.ConnectError(str(exc), request=request) from exc

    return check


@asynccontextmanager
async def _connect(
    server: McpServer, allowed: Sequence[str], seconds: float
) -> AsyncIterator[Client]:
    """A client session with the server; every request it sends is checked first."""
    timeout = seconds
    await check_url(server.url, allowed)
    hooks = {"request": [_guard(allowed)]}
    limits = httpx2.Timeout(timeout)
    headers = dict(server.headers)
    key = server.cache_key()

    async def on_message(message: IncomingMessage) -> None:
        if isinstance(message, mcp_types.ToolListChangedNotification):
            CACHE.drop(key)

    if server.transport == "sse":

        def factory(
            headers: dict[str, str] | None = None,
            timeout: httpx2.Timeout | None = None,
            auth: httpx2.Auth | None = None,
        ) -> httpx2.AsyncClient:
            return httpx2.AsyncClient(
                headers=headers, timeout=timeout or limits, auth=auth, event_hooks=hooks
            )

        transport: Any = sse_client(
            server.url,
            headers=headers,
            timeout=timeout,
            sse_read_timeout=timeout,
            httpx_client_factory=factory,
        )
        async with Client(
            transport, mode="legacy", read_timeout_seconds=timeout, message_handler=on_message
        ) as client:
            yield client
        return
    async with (
        httpx2.AsyncClient(headers=headers, timeout=limits, event_hooks=hooks) as http,
        Client(
            streamable_http_client(
                server.url, http_client=http, max_sse_event_size=MAX_MESSAGE_BYTES
            ),
            mode="legacy",
            read_timeout_seconds=timeout,
            message_handler=on_message,
        ) as client,
    ):
        yield client


async def _fetch(server: McpServer, allowed: Sequence[str], seconds: float) -> list[mcp_types.Tool]:
    tools: list[mcp_types.Tool] = []
    async with asyncio.timeout(seconds), _connect(server, allowed, seconds) as client:
        cursor: str | None = None
        for _ in range(100):  # pages: a server that never stops paging is cut off here
            page = await client.list_tools(cursor=cursor)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if cursor is None:
                break
    return tools


def schema_problem(schema: Any) -> str | None:
    """Why an input schema cannot be offered to a model, or None."""
    if not isinstance(schema, dict):
        return "its input schema is not an object"
    if schema.get("type") != "object":
        return "its input schema's type is not object"
    try:
        valid = jsonschema_rs.meta.is_valid(schema)
    except Exception as exc:  # a schema the checker cannot even read
        return f"its input schema cannot be read: {exc}"
    return None if valid else "its input schema is not a valid JSON Schema"


async def list_tools(
    servers: Sequence[McpServer], allowed: Sequence[str], *, seconds: float, ttl: float
) -> Listing:
    """The run's MCP tool definitions, in server order; an unreachable server or an unusable
    tool is a warning, never a failure."""

    async def one(server: McpServer) -> tuple[list[mcp_types.Tool] | None, str | None]:
        cached = CACHE.get(server.cache_key())
        if cached is not None:
            return cached, None
        try:
            fetched = await _fetch(server, allowed, seconds)
        except BaseException as exc:  # any failure: the run goes on without it
            if isinstance(exc, asyncio.CancelledError):
                raise
            return None, f"MCP server {server.name} offers no tools: {_reason(exc, seconds)}"
        CACHE.put(server.cache_key(), fetched, ttl)
        return fetched, None

    results = await asyncio.gather(*(one(s) for s in servers))
    definitions: list[dict[str, Any]] = []
    warnings: list[str] = []
    approvals: dict[str, ApprovalRule] = {}
    for server, (tools, warning) in zip(servers, results, strict=True):
        if warning is not None:
            warnings.append(warning)
        for tool in tools or []:
            if server.allowed_tools is not None and tool.name not in server.allowed_tools:
                continue
            problem = schema_problem(tool.input_schema)
            if problem is not None:
                warnings.append(f"MCP tool {tool.name} of {server.name} is left out: {problem}")
                continue
            name = tool_name(server.name, tool.name)
            if server.require_approval is not None:
                read_only = bool(tool.annotations and tool.annotations.read_only_hint)
                approvals[name] = approval_rule(
                    server.require_approval, tool.name, read_only=read_only
                )
            definitions.append(
                {
                    "name": name,
                    "kind": "mcp",
                    "description": tool.description or "",
                    "parameters": tool.input_schema,
                }
            )
    return Listing(definitions, warnings, approvals)


def _reason(exc: BaseException, timeout: float) -> str:
    if isinstance(exc, TimeoutError):
        return f"no answer within {timeout:g} s"
    if isinstance(exc, OutboundRefused):
        return str(exc)
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_reason(e, timeout) for e in exc.exceptions)
    if isinstance(exc, httpx2.HTTPStatusError):
        return f"it answered {exc.response.status_code}"
    return f"{type(exc).__name__}: {exc}"[:500]


async def call_tool(
    server: McpServer,
    tool: str,
    arguments: dict[str, Any],
    allowed: Sequence[str],
    *,
    seconds: float,
) -> ToolOutcome:
    """One call, within `seconds`; whatever happens, an outcome the model can read."""
    if server.allowed_tools is not None and tool not in server.allowed_tools:
        return ToolOutcome(f"Error: {server.name} does not offer the tool {tool!r}.", True)
    try:
        async with asyncio.timeout(seconds), _connect(server, allowed, seconds) as client:
            result = await client.call_tool(tool, arguments)
    except BaseException as exc:  # a failing server is news for the model
        if isinstance(exc, asyncio.CancelledError):
            raise
        reason = _reason(exc, seconds).rstrip(".")
        return ToolOutcome(f"Error: MCP tool {tool} of {server.name} failed: {reason}.", True)
    return outcome_of(result)


def outcome_of(result: mcp_types.CallToolResult) -> ToolOutcome:
    """The journal's tool result: the text (cut at MAX_RESULT_CHARS), and the structured
    content when there is any; isError makes it an error result."""
    parts: list[str] = []
    for block in result.content:
        if isinstance(block, mcp_types.TextContent):
            parts.append(block.text)
        else:
            parts.append(f"[{block.type} content]")
    text = "\n".join(parts)
    if len(text) > MAX_RESULT_CHARS:
        cut = len(text) - MAX_RESULT_CHARS
        text = text[:MAX_RESULT_CHARS] + f"\n[... {cut} more characters cut]"
    if result.structured_content is not None and not result.is_error:
        content: Any = {"text": text, "structured_content": result.structured_content}
        if len(json.dumps(result.structured_content)) > MAX_RESULT_CHARS:
            content = text + "\n[structured content too large, left out]"
    else:
        content = text
    return ToolOutcome(content, is_error=bool(result.is_error))
