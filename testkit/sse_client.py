"""A strict SSE reader for tests and benchmarks: real HTTP, every field parsed, comment lines
(heartbeats) skipped."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx

from app.eventlog import registry as events_registry


@dataclass(frozen=True)
class Event:
    id: int
    type: str
    data: dict[str, Any]


TERMINAL = frozenset(str(t) for t in events_registry.TERMINAL_EVENTS)  # the run is over


async def events(response: httpx.Response) -> AsyncIterator[Event]:
    """Parse a text/event-stream body as it arrives; comment lines are skipped."""
    assert response.headers["content-type"].startswith("text/event-stream"), response.headers
    fields: dict[str, str] = {}
    async for line in response.aiter_lines():
        if line == "":
            if fields:
                yield Event(int(fields["id"]), fields["event"], json.loads(fields["data"]))
            fields = {}
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        fields[name] = value[1:] if value.startswith(" ") else value


async def collect(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    *,
    stop_after: int | None = None,
    until: str | None = None,
    **kwargs: Any,
) -> list[Event]:
    """Events until the terminal one (or `stop_after` of them, or one of type `until`, then
    hang up)."""
    out: list[Event] = []
    async with client.stream(method, url, **kwargs) as response:
        assert response.status_code == 200, (await response.aread()).decode()
        async for event in events(response):
            out.append(event)
            if (
                event.type in TERMINAL
                or event.type == until
                or (stop_after is not None and len(out) >= stop_after)
            ):
                break
    return out


@dataclass(frozen=True)
class Ended:
    """A whole response read to the end: its status and, for a stream, every event in it."""

    status: int
    events: list[Event]
    body: str = ""


# Only a safety net, so that a stream the server never ends fails the test instead of hanging
# it (heartbeats would keep a read timeout from ever firing); no test measures time with it.
SAFETY_NET_SECONDS = 120


async def until_closed(response: httpx.Response) -> list[Event]:
    """Every event of an open stream until the server ends it: returning at all is the proof
    that the server closed the stream."""
    try:
        async with asyncio.timeout(SAFETY_NET_SECONDS):
            return [event async for event in events(response)]
    except TimeoutError:
        raise AssertionError(f"the server kept {response.url} open") from None


async def read_to_end(client: httpx.AsyncClient, method: str, url: str, **kwargs: Any) -> Ended:
    """Send a request and read its response until the server ends it (past any terminal
    event)."""
    async with client.stream(method, url, **kwargs) as response:
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            return Ended(response.status_code, await until_closed(response))
        return Ended(response.status_code, [], (await response.aread()).decode())


async def streamed_ask(
    client: httpx.AsyncClient, session_id: str, text: str, **body: Any
) -> list[Event]:
    """An ask of `text` in the session, streamed: its events until the terminal one."""
    return await collect(
        client, "POST", f"/v1/sessions/{session_id}/ask", json={"input": text, **body}
    )
