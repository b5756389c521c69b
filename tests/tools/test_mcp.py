"""MCP tools against a real MCP server (the SDK's MCPServer, streamable HTTP on 127.0.0.1):
lists namespaced and checked, results, errors, timeouts, size caps, list changes, tokens, a
server that is down, and outbound refusals; nothing here raises."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import RedirectResponse
from starlette.routing import Route

from app.config import Settings
from app.core.mcp import McpServer
from app.core.tool_loop import PendingCall
from app.tools.mcp import CACHE, MAX_RESULT_CHARS, call_tool, list_tools
from app.tools.registry import ToolContext, execute
from testkit.mcp_server import BIG_CHARS, McpTestServer
from testkit.server import serve_in_thread, stop_thread_server

ANY = ["*"]
TOKEN = "mcp-bearer-token-123"


@pytest.fixture(scope="module")
def open_server() -> Iterator[McpTestServer]:
    with McpTestServer() as server:
        yield server


@pytest.fixture(scope="module")
def locked_server() -> Iterator[McpTestServer]:
    with McpTestServer(token=TOKEN) as server:
        yield server


@pytest.fixture(autouse=True)
def fresh_cache() -> None:
    CACHE.lists.clear()


def server_at(url: str, name: str = "calc", **fields: Any) -> McpServer:
    return McpServer(name=name, url=url, **fields)


async def test_tools_are_listed_namespaced_and_an_invalid_schema_is_left_out(
    open_server: McpTestServer,
) -> None:
    listing = await list_tools([server_at(open_server.url)], ANY, seconds=10, ttl=60)
    names = [t["name"] for t in listing.tools]
    assert names == ["calc__add", "calc__fail", "calc__hang", "calc__big", "calc__grow"]
    add = listing.tools[0]
    assert add["kind"] == "mcp"
    assert add["parameters"]["required"] == ["a", "b"]
    assert listing.warnings == [
        "MCP tool weird of calc is left out: its input schema is not a valid JSON Schema"
    ]


async def test_two_servers_with_the_same_tools_do_not_collide(open_server: McpTestServer) -> None:
    servers = [server_at(open_server.url, "one"), server_at(open_server.url, "two")]
    listing = await list_tools(servers, ANY, seconds=10, ttl=60)
    names = [t["name"] for t in listing.tools]
    assert "one__add" in names and "two__add" in names
    assert len(names) == len(set(names))


async def test_the_allow_list_limits_the_tools(open_server: McpTestServer) -> None:
    server = server_at(open_server.url, allowed_tools=("add",))
    listing = await list_tools([server], ANY, seconds=10, ttl=60)
    assert [t["name"] for t in listing.tools] == ["calc__add"]
    refused = await call_tool(server, "fail", {}, ANY, seconds=10)
    assert refused.is_error and "does not offer" in refused.content


async def test_a_result_keeps_its_text_and_structured_content(open_server: McpTestServer) -> None:
    outcome = await call_tool(server_at(open_server.url), "add", {"a": 2, "b": 3}, ANY, seconds=10)
    assert not outcome.is_error
    assert outcome.content == {"text": "5", "structured_content": {"result": 5}}


async def test_is_error_becomes_an_error_result(open_server: McpTestServer) -> None:
    outcome = await call_tool(server_at(open_server.url), "fail", {}, ANY, seconds=10)
    assert outcome.is_error
    assert "fail" in outcome.content


async def test_a_hanging_tool_times_out_as_an_error_result(open_server: McpTestServer) -> None:
    outcome = await call_tool(server_at(open_server.url), "hang", {}, ANY, seconds=1)
    assert outcome.is_error
    assert outcome.content == "Error: MCP tool hang of calc failed: no answer within 1 s."


async def test_a_1_mb_text_is_cut(open_server: McpTestServer) -> None:
    outcome = await call_tool(server_at(open_server.url), "big", {}, ANY, seconds=30)
    assert not outcome.is_error
    assert isinstance(outcome.content, str)
    assert outcome.content.startswith("x" * MAX_RESULT_CHARS + "\n[... ")
    assert f"{BIG_CHARS - MAX_RESULT_CHARS} more characters cut" in outcome.content


async def test_a_list_change_drops_the_cached_list(open_server: McpTestServer) -> None:
    server = server_at(open_server.url, "growing")
    first = await list_tools([server], ANY, seconds=10, ttl=3600)
    assert "growing__extra" not in [t["name"] for t in first.tools]
    assert (await call_tool(server, "grow", {}, ANY, seconds=10)).content["text"] == "grown"
    again = await list_tools([server], ANY, seconds=10, ttl=3600)
    assert "growing__extra" in [t["name"] for t in again.tools]


async def test_a_cached_list_is_reused_within_its_ttl(open_server: McpTestServer) -> None:
    server = server_at(open_server.url)
    await list_tools([server], ANY, seconds=10, ttl=3600)
    cached = CACHE.get(server.cache_key())
    assert cached is not None
    down = McpServer(name="calc", url="http://127.0.0.1:1/mcp")  # another identity: not cached
    assert CACHE.get(down.cache_key()) is None


async def test_a_server_that_needs_a_token(locked_server: McpTestServer) -> None:
    without = await list_tools([server_at(locked_server.url)], ANY, seconds=10, ttl=60)
    assert without.tools == []
    assert without.warnings[0].startswith("MCP server calc offers no tools: ")
    authorized = server_at(locked_server.url, headers={"Authorization": f"Bearer {TOKEN}"})
    listing = await list_tools([authorized], ANY, seconds=10, ttl=60)
    assert "calc__add" in [t["name"] for t in listing.tools]
    outcome = await call_tool(authorized, "add", {"a": 1, "b": 1}, ANY, seconds=10)
    assert outcome.content["structured_content"] == {"result": 2}
    anonymous = server_at(locked_server.url)
    refused = await call_tool(anonymous, "add", {"a": 1, "b": 1}, ANY, seconds=10)
    assert refused.is_error


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port  # nobody listens on it once the socket is closed


async def test_a_server_that_is_down(open_server: McpTestServer) -> None:
    down = server_at(f"http://127.0.0.1:{closed_port()}/mcp", "down")
    listing = await list_tools([down, server_at(open_server.url)], ANY, seconds=10, ttl=60)
    assert "calc__add" in [t["name"] for t in listing.tools]  # the other server still serves
    assert any(w.startswith("MCP server down offers no tools: ") for w in listing.warnings)
    outcome = await call_tool(down, "add", {"a": 1, "b": 1}, ANY, seconds=10)
    assert outcome.is_error and outcome.content.startswith("Error: MCP tool add of down failed")


async def test_a_metadata_address_is_refused() -> None:
    server = server_at("http://169.254.169.254/mcp", "meta")
    outcome = await call_tool(server, "add", {}, ANY, seconds=10)
    assert outcome.is_error
    assert "not an address tool calls may reach" in outcome.content
    listing = await list_tools([server], ANY, seconds=10, ttl=60)
    assert "not an address tool calls may reach" in listing.warnings[0]


async def test_a_redirect_to_a_metadata_address_is_not_followed() -> None:
    async def moved(request: Request) -> RedirectResponse:
        return RedirectResponse("http://169.254.169.254/mcp", status_code=307)

    app = Starlette(routes=[Route("/mcp", moved, methods=["GET", "POST", "DELETE"])])
    server, thread, url = serve_in_thread(app)
    try:
        outcome = await call_tool(server_at(f"{url}/mcp"), "add", {}, ANY, seconds=10)
    finally:
        stop_thread_server(server, thread)
    assert outcome.is_error
    assert "169.254.169.254" in outcome.content


async def test_the_registry_routes_mcp_calls_and_checks_webhook_urls(
    open_server: McpTestServer,
) -> None:
    server = server_at(open_server.url)
    tools = [
        {"name": "calc__add", "kind": "mcp"},
        {"name": "meta", "kind": "webhook", "url": "http://169.254.169.254/latest"},
    ]
    context = ToolContext("tenant", "session", "run", "call-1")
    settings = Settings(database_url="postgresql://unused/db")
    added = await execute(
        PendingCall("call-1", "calc__add", {"a": 4, "b": 5}, 1),
        tools,
        context,
        settings=settings,
        mcp_servers={"calc": server},
    )
    assert added.content["structured_content"] == {"result": 9}
    unknown = await execute(
        PendingCall("call-2", "calc__add", {"a": 4, "b": 5}, 1), tools, context, settings=settings
    )
    assert unknown.is_error and "no MCP server" in unknown.content
    refused = await execute(PendingCall("call-3", "meta", {}, 1), tools, context, settings=settings)
    assert refused.is_error and "not an address tool calls may reach" in refused.content


async def test_a_run_is_never_stuck_on_a_server_that_answers_garbage() -> None:
    async def garbage(request: Request) -> Any:
        from starlette.responses import PlainTextResponse

        return PlainTextResponse("{not json", media_type="application/json")

    app = Starlette(routes=[Route("/mcp", garbage, methods=["GET", "POST", "DELETE"])])
    server, thread, url = serve_in_thread(app)
    try:
        outcome = await asyncio.wait_for(
            call_tool(server_at(f"{url}/mcp"), "add", {}, ANY, seconds=5), 30
        )
        listing = await list_tools([server_at(f"{url}/mcp")], ANY, seconds=5, ttl=60)
    finally:
        stop_thread_server(server, thread)
    assert outcome.is_error
    assert listing.tools == [] and listing.warnings
