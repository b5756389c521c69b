"""A real MCP tool server for tests: the `mcp` SDK's MCPServer over streamable HTTP on 127.0.0.1.

    with McpTestServer(token="s3cret") as server:   # token: requests without it answer 401
        server.url                                  # http://127.0.0.1:<port>/mcp

Its tools: `add` (succeeds, with structured content), `fail` (an isError result), `hang`
(never answers), `big` (a 1 MB text), `grow` (adds the tool `extra` and tells the client its
list changed), and `weird`, whose declared input schema is no valid JSON Schema.
"""

from __future__ import annotations

import asyncio
from types import TracebackType

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from starlette.types import ASGIApp, Receive, Scope, Send

from testkit.server import serve_in_thread, stop_thread_server

BIG_CHARS = 1_000_000
INVALID_SCHEMA = {"type": "object", "properties": {"x": {"type": "no-such-type"}}}


def build_server() -> MCPServer:
    mcp = MCPServer("threadline-test")

    @mcp.tool(description="Add two integers.")
    def add(a: int, b: int) -> int:
        return a + b

    @mcp.tool(description="Always fails.")
    def fail(reason: str = "broken") -> str:
        raise ToolError(f"it failed: {reason}")

    @mcp.tool(description="Never answers.")
    async def hang() -> str:
        await asyncio.sleep(3600)
        return "late"

    @mcp.tool(description="A 1 MB text.")
    def big() -> str:
        return "x" * BIG_CHARS

    @mcp.tool(description="Adds the tool `extra` to the list.")
    async def grow(ctx: Context) -> str:
        if "extra" not in {t.name for t in await mcp.list_tools()}:
            mcp.add_tool(lambda: "extra!", name="extra", description="Appeared later.")
        await ctx.session.send_tool_list_changed()
        return "grown"

    @mcp.tool(description="Declares a schema no model can take.")
    def weird(x: str = "") -> str:
        return x

    # The SDK derives schemas from signatures: this one is made invalid on purpose.
    tool = mcp._tool_manager.get_tool("weird")
    assert tool is not None
    tool.parameters = INVALID_SCHEMA
    return mcp


class _BearerOnly:
    """401 for requests without `Authorization: Bearer <token>`."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app, self.expected = app, f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and dict(scope["headers"]).get(b"authorization") != (
            self.expected
        ):
            await send({"type": "http.response.start", "status": 401, "headers": []})
            await send({"type": "http.response.body", "body": b"unauthorized"})
            return
        await self.app(scope, receive, send)


class McpTestServer:
    def __init__(self, token: str | None = None) -> None:
        self.token = token

    def __enter__(self) -> McpTestServer:
        app: ASGIApp = build_server().streamable_http_app()
        if self.token is not None:
            app = _BearerOnly(app, self.token)
        self._server, self._thread, base = serve_in_thread(app)
        self.url = f"{base}/mcp"
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        stop_thread_server(self._server, self._thread)
