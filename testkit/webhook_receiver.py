"""A webhook receiver for tests: a real uvicorn in a thread recording every POST, answering
scripted failures first (then 200)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from dataclasses import dataclass
from types import TracebackType

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from testkit.server import free_port, serve_in_thread, stop_thread_server


@dataclass(frozen=True)
class Received:
    headers: dict[str, str]
    body: str
    answered: int  # the status this receiver answered


class WebhookReceiver:
    """`with WebhookReceiver() as receiver:` serves on `receiver.url`; `fail_next(500, 500)`
    answers the next two requests 500. `start()` again after `stop()` serves the same port."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/hook"
        self._received: list[Received] = []
        self._failures: deque[int] = deque()
        self._lock = threading.Lock()
        self._server: tuple[object, threading.Thread] | None = None
        self.app = Starlette(routes=[Route("/hook", self._hook, methods=["POST"])])

    async def _hook(self, request: Request) -> Response:
        body = (await request.body()).decode()
        with self._lock:
            status = self._failures.popleft() if self._failures else 200
            self._received.append(Received(dict(request.headers), body, status))
        return Response(f"answered {status}", status_code=status)

    def fail_next(self, *statuses: int) -> None:
        with self._lock:
            self._failures.extend(statuses)

    @property
    def received(self) -> list[Received]:
        with self._lock:
            return list(self._received)

    async def wait_for(self, count: int) -> list[Received]:
        """The first `count` requests, once that many arrived (within a generous two minutes:
        loaded machines)."""
        deadline = time.monotonic() + 120
        while len(self.received) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"{len(self.received)} webhooks received, not {count}")
            await asyncio.sleep(0.05)
        return self.received[:count]

    def start(self) -> None:
        server, thread, _ = serve_in_thread(self.app, self.port)
        self._server = (server, thread)

    def stop(self) -> None:
        if self._server is not None:
            server, thread = self._server
            stop_thread_server(server, thread)  # type: ignore[arg-type]
            self._server = None

    def __enter__(self) -> WebhookReceiver:
        self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
