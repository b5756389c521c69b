"""Request body size limit, enforced while the body streams in (Content-Length can lie)."""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.errors import error_json


class BodySizeLimit:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(scope, receive, send)
            return
        seen = 0

        async def counting_receive() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                # Raised inside body parsing; FastAPI re-raises HTTPExceptions to our handler.
                raise HTTPException(413, self._message())
            return message

        await self.app(scope, counting_receive, send)

    def _message(self) -> str:
        return f"request body exceeds {self.max_bytes} bytes"

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = error_json(413, "request_too_large", self._message(), {"limit": self.max_bytes})
        await response(scope, receive, send)
