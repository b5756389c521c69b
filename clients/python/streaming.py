"""Typed, resumable run streams for the generated client (on httpx-sse).

    from threadline_client import AuthenticatedClient
    from threadline_client.models import MessageDeltaEvent, RunCompletedEvent
    from threadline_client.streaming import ask, run_events

    client = AuthenticatedClient(base_url="http://127.0.0.1:8000", token=API_KEY)
    for event in ask(client, session_id, {"input": "Hello!"}):
        if isinstance(event, MessageDeltaEvent):
            print(event.data.text, end="", flush=True)
        elif isinstance(event, RunCompletedEvent):
            print(f"\\n({event.data.usage.output_tokens} tokens)")

`aask` and `arun_events` are the same for asyncio (`async for event in aask(...)`); to leave
such a loop early, iterate inside `contextlib.aclosing(aask(...))` so that the connection
closes at once rather than when the generator is collected.

Every item is the generated model of its event type (`MessageDeltaEvent`, `ToolCallEvent`,
`RunCompletedEvent`, ...: one per type the document lists), so `event.data` is typed. A
dropped connection is resumed from the last event received (`Last-Event-ID`), on any API
instance, and each event still arrives once; the iteration ends after the run's terminal event
(`run.completed`, `run.failed` or `run.cancelled`). Leaving the loop early closes the
connection (the run goes on: resume it later with `run_events(client, run_id, after=last_id)`).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

import httpx
from httpx_sse import ServerSentEvent, aconnect_sse, connect_sse

from . import models
from .client import AuthenticatedClient, Client

TERMINAL = frozenset({"run.completed", "run.failed", "run.cancelled"})
# Heartbeats come every 15 s by default: a minute of silence is a dead connection.
READ_TIMEOUT_SECONDS = 60.0


class StreamRefused(Exception):
    """The server answered with an error instead of a stream (its JSON error is `error`)."""

    def __init__(self, status_code: int, error: dict[str, Any]) -> None:
        super().__init__(f"{status_code} {error.get('code')}: {error.get('message')}")
        self.status_code = status_code
        self.error = error


def event_model(event_type: str) -> Any:
    """The generated model of an event type: `message.delta` -> `MessageDeltaEvent`."""
    name = "".join(part.capitalize() for part in re.split(r"[._]", event_type)) + "Event"
    return getattr(models, name)


def is_heartbeat(sse: ServerSentEvent) -> bool:
    """httpx-sse turns the blank line after a heartbeat comment into an event without data
    (it carries the last event id over): not a run event."""
    return sse.data == ""


def parse(sse: ServerSentEvent) -> Any:
    """One SSE event as the generated model of its type."""
    body = {"id": sse.id, "event": sse.event, "data": json.loads(sse.data)}
    return event_model(sse.event).from_dict(body)


def ask(
    client: AuthenticatedClient | Client,
    session_id: str,
    body: Mapping[str, Any],
    *,
    idempotency_key: str | None = None,
    reconnects: int = 5,
) -> Iterator[Any]:
    """Ask and stream the run's events to its end, resuming it if the connection drops.

    `body` is the ask's JSON body (`input`, and optionally `model`, `tools`, ...); `stream` is
    set. An error answer (e.g. 409 `session_busy`) raises StreamRefused."""
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
    run_id: str | None = None
    last_id = 0
    try:
        with connect_sse(
            client.get_httpx_client(),
            "POST",
            f"/v1/sessions/{session_id}/ask",
            json={**body, "stream": True},
            headers=headers,
            timeout=_timeout(),
        ) as source:
            if source.response.status_code == 202:  # a repeated Idempotency-Key's run, over
                return
            _check(source.response)
            for sse in source.iter_sse():
                if is_heartbeat(sse):
                    continue
                event = parse(sse)
                last_id = int(sse.id)
                if sse.event == "run.created":
                    run_id = event.data.run_id
                yield event
                if sse.event in TERMINAL:
                    return
    except httpx.TransportError:
        if run_id is None:  # nothing says which run: ask again with the same Idempotency-Key
            raise
    if run_id is not None:
        yield from run_events(client, run_id, after=last_id, reconnects=reconnects)


def run_events(
    client: AuthenticatedClient | Client,
    run_id: str,
    *,
    after: int = 0,
    reconnects: int = 5,
) -> Iterator[Any]:
    """A run's events after event `after` (0: from its first), to its terminal event; a
    dropped connection is resumed with Last-Event-ID, up to `reconnects` failures in a row.
    Nothing when the run is over and nothing is left to send (204)."""
    failures = 0
    while True:
        try:
            with connect_sse(
                client.get_httpx_client(),
                "GET",
                f"/v1/runs/{run_id}/events",
                headers={"Last-Event-ID": str(after)},
                timeout=_timeout(),
            ) as source:
                if source.response.status_code == 204:
                    return
                _check(source.response)
                for sse in source.iter_sse():
                    if is_heartbeat(sse):
                        continue
                    event = parse(sse)
                    after = int(sse.id)
                    failures = 0
                    yield event
                    if sse.event in TERMINAL:
                        return
        except httpx.TransportError:
            failures += 1
            if failures > reconnects:
                raise
            time.sleep(min(0.2 * 2**failures, 5.0))


async def aask(
    client: AuthenticatedClient | Client,
    session_id: str,
    body: Mapping[str, Any],
    *,
    idempotency_key: str | None = None,
    reconnects: int = 5,
) -> AsyncIterator[Any]:
    """`ask`, for asyncio."""
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
    run_id: str | None = None
    last_id = 0
    try:
        async with aconnect_sse(
            client.get_async_httpx_client(),
            "POST",
            f"/v1/sessions/{session_id}/ask",
            json={**body, "stream": True},
            headers=headers,
            timeout=_timeout(),
        ) as source:
            if source.response.status_code == 202:  # a repeated Idempotency-Key's run, over
                return
            await _acheck(source.response)
            async for sse in source.aiter_sse():
                if is_heartbeat(sse):
                    continue
                event = parse(sse)
                last_id = int(sse.id)
                if sse.event == "run.created":
                    run_id = event.data.run_id
                yield event
                if sse.event in TERMINAL:
                    return
    except httpx.TransportError:
        if run_id is None:
            raise
    if run_id is not None:
        async for event in arun_events(client, run_id, after=last_id, reconnects=reconnects):
            yield event


async def arun_events(
    client: AuthenticatedClient | Client,
    run_id: str,
    *,
    after: int = 0,
    reconnects: int = 5,
) -> AsyncIterator[Any]:
    """`run_events`, for asyncio."""
    failures = 0
    while True:
        try:
            async with aconnect_sse(
                client.get_async_httpx_client(),
                "GET",
                f"/v1/runs/{run_id}/events",
                headers={"Last-Event-ID": str(after)},
                timeout=_timeout(),
            ) as source:
                if source.response.status_code == 204:
                    return
                await _acheck(source.response)
                async for sse in source.aiter_sse():
                    if is_heartbeat(sse):
                        continue
                    event = parse(sse)
                    after = int(sse.id)
                    failures = 0
                    yield event
                    if sse.event in TERMINAL:
                        return
        except httpx.TransportError:
            failures += 1
            if failures > reconnects:
                raise
            await asyncio.sleep(min(0.2 * 2**failures, 5.0))


def _timeout() -> httpx.Timeout:
    return httpx.Timeout(30.0, read=READ_TIMEOUT_SECONDS)


def _check(response: httpx.Response) -> None:
    if response.status_code == 200:
        return
    response.read()
    _refuse(response)


async def _acheck(response: httpx.Response) -> None:
    if response.status_code == 200:
        return
    await response.aread()
    _refuse(response)


def _refuse(response: httpx.Response) -> None:
    try:
        error = response.json()["error"]
    except (ValueError, KeyError, TypeError):
        error = {"code": f"http_{response.status_code}", "message": response.text}
    raise StreamRefused(response.status_code, error)
