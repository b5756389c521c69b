"""The one stream path of a run: its events followed to the end, heartbeats, disconnects.

Every surface streams a run the same way (native SSE in app/api/sse.py, the AI SDK's UI
message stream in app/api/ui_messages.py, the OpenAI Responses stream in app/openai_api): it
follows the run's events from the event hub, replayed then live, until the terminal event (or
until its own wire says its answer is over: a wait for the client's tool outputs); `:` comment
heartbeats keep an idle connection alive. A client leaving is not a cancel, unless its request
asked for one (`on_client_gone`); an error of ours drops the connection without a clean end
(which would read as "the run is over") and cancels nothing: the client resumes. A surface
gives only its Wire: how a batch of events is written in its protocol.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from sse_starlette import EventSourceResponse, ServerSentEvent

from app.eventlog.hub import EventHub
from app.telemetry import metrics

Row = dict[str, Any]
STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class Wire:
    """A surface's wire mapping of a run's events: frames (encoded SSE events) per batch."""

    ended = False  # the surface's answer is over before the run is (no more frames wanted)

    def opening(self) -> list[bytes]:
        """Frames sent before the first event."""
        return []

    async def frames(self, rows: list[Row]) -> list[bytes]:
        """The frames of a batch of the run's events, in seq order (once `ended`, none)."""
        raise NotImplementedError

    def closing(self) -> list[bytes]:
        """Frames sent after the last event, when the stream ends cleanly."""
        return []

    def close(self) -> None:
        """The stream is over, however it ended (work the wire started is stopped)."""


def sse_frame(data: str, event: str | None = None) -> bytes:
    """One SSE event, encoded (for a Wire)."""
    return ServerSentEvent(data=data, event=event).encode()


def run_stream(
    hub: EventHub,
    run_id: str,
    after_seq: int,
    heartbeat_seconds: float,
    wire: Wire,
    on_client_gone: Callable[[], Awaitable[None]] | None = None,
    headers: Mapping[str, str] | None = None,
) -> EventSourceResponse:
    """The run's events after `after_seq` through `wire`, as an SSE response that ends with the
    run (or the wire). `on_client_gone`: what a client leaving early does (None: nothing)."""

    async def events() -> AsyncIterator[bytes]:
        finished = False
        try:
            opening = wire.opening()
            if opening:
                yield b"".join(opening)
            async for rows in hub.follow_batches(run_id, after_seq):
                frames = await wire.frames(rows)
                if frames:
                    yield b"".join(frames)  # one write for a page of the backlog
                if wire.ended:
                    break
            finished = True
            closing = wire.closing()
            if closing:
                yield b"".join(closing)
        except Exception:
            # Ours, not the client's: e.g. an outage longer than the hub waits. The connection
            # is dropped (no clean end); the client resumes. Not a reason to cancel the run.
            finished = True
            raise
        finally:
            wire.close()
            # sse-starlette ends the generator with CancelledError when the client leaves;
            # that is not a cancel of the run, unless the request asked for it.
            if not finished and on_client_gone is not None:
                await asyncio.shield(on_client_gone())

    return EventSourceResponse(
        metrics.counted_stream(events()),
        ping=heartbeat_seconds,
        headers={**STREAM_HEADERS, **(headers or {})},
    )
