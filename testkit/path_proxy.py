"""A reverse proxy that serves a service under a path, as nginx's
`location /chat/ { proxy_pass http://threadline/; }` does: the prefix is stripped, bodies are
streamed both ways (SSE included), and the service is not told about the prefix (no
X-Forwarded-Prefix, no root_path): whatever works through it finds its way by relative URLs."""

from __future__ import annotations

import httpx
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import PlainTextResponse, StreamingResponse
from starlette.types import ASGIApp, Receive, Scope, Send

# Headers that belong to one connection, not to the message (RFC 9110 §7.6.1).
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "host"}


def path_proxy(upstream_url: str, prefix: str) -> ASGIApp:
    """An ASGI app proxying `prefix`/... to `upstream_url`/... (`prefix` without a trailing
    slash, e.g. "/chat")."""
    client = httpx.AsyncClient(base_url=upstream_url, timeout=None)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await client.aclose()
            await send({"type": "lifespan.shutdown.complete"})
            return
        path: str = scope["path"]
        if scope["type"] != "http" or not path.startswith(prefix + "/"):
            await PlainTextResponse("not proxied", status_code=404)(scope, receive, send)
            return
        request = Request(scope, receive)
        upstream = client.build_request(
            request.method,
            path[len(prefix) :],
            params=request.url.query,
            headers=[(k, v) for k, v in request.headers.raw if k.decode() not in HOP_BY_HOP],
            content=request.stream(),
        )
        response = await client.send(upstream, stream=True)
        headers = {k: v for k, v in response.headers.items() if k not in HOP_BY_HOP}
        await StreamingResponse(
            response.aiter_raw(),
            status_code=response.status_code,
            headers=headers,
            background=BackgroundTask(response.aclose),
        )(scope, receive, send)

    return app
