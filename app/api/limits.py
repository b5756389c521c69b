"""Request body size limit, enforced while the body streams in (Content-Length can lie)."""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.errors import error_json


class BodySizeLimit:
    """`max_bytes` for every body; `larger` gives some paths (a streamed upload) their own."""

    def __init__(self, app: ASGIApp, max_bytes: int, larger: dict[str, int] | None = None) -> None:
        self.app = app
        self.default_bytes = max_bytes
        self.larger = larger or {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        max_bytes = self.larger.get(scope["path"], self.default_bytes)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > max_bytes:
            await self._refuse(max_bytes, scope, receive, send)
            return
        seen = 0

        async def counting_receive() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > max_bytes:
                # Raised inside body parsing; FastAPI re-raises HTTPExceptions to our handler.
                raise HTTPException(413, self._message(max_bytes))
            return message

        await self.app(scope, counting_receive, send)

    def _message(self, max_bytes: int) -> str:
        return f"request body exceeds {max_bytes} bytes"

    async def _refuse(self, max_bytes: int, scope: Scope, receive: Receive, send: Send) -> None:
        response = error_json(
            413, "request_too_large", self._message(max_bytes), {"limit": max_bytes}
        )
        await response(scope, receive, send)
