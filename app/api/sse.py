"""Server-Sent Events of a run: `id:` is the event's seq, `event:` its type, `data:` JSON.

This is where the registry's event types (app/eventlog/registry.py) become the native wire
shape: the stream itself, and its description in the OpenAPI document (event_schemas).

Resuming is exactly-once: a client reconnects with `Last-Event-ID` (or `?starting_after=`) and
gets every later event once, on any API instance. Comment lines keep idle connections alive.
A stream ends with its run; a run that is over with nothing left to send gets no stream at all.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal

from fastapi import Depends, Header, Query
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema
from sse_starlette import EventSourceResponse

from app.eventlog.hub import EventHub
from app.eventlog.registry import PAYLOADS, TERMINAL_EVENTS, EventData, EventType
from app.eventlog.store import MAX_EVENT_SEQ
from app.eventlog.stream import Row, Wire, run_stream

# Where the document keeps the schemas (components) that SSE_RESPONSE refers to.
SCHEMA_REF = "#/components/schemas/{model}"
RUN_EVENT = "RunEvent"
_TERMINALS = ", ".join(f"`{t}`" for t in EventType if t in TERMINAL_EVENTS)
SSE_DESCRIPTION = (
    "A stream of run events (text/event-stream). Each event has `id:` (the run event's seq, "
    "for Last-Event-ID), `event:` (its type) and `data:` (its payload: one line of JSON). "
    f"`{RUN_EVENT}` lists every type, when it is sent and the schema of its payload. Exactly "
    f"one terminal event ({_TERMINALS}) ends the run, and the stream. Lines starting with `:` "
    "are heartbeats."
)
SSE_RESPONSE: dict[int | str, dict[str, Any]] = {
    200: {
        "description": SSE_DESCRIPTION,
        "content": {"text/event-stream": {"schema": {"$ref": SCHEMA_REF.format(model=RUN_EVENT)}}},
    }
}


def event_schemas() -> dict[str, dict[str, Any]]:
    """The schemas SSE_RESPONSE refers to, by component name: every payload model of the
    registry (and the models they use), one `<Type>Event` per type ({id, event, data}) and
    `RunEvent`, their union, discriminated by `event`."""
    models: list[tuple[type[BaseModel], Literal["serialization"]]] = [
        (model, "serialization") for model in PAYLOADS.values()
    ]
    _, top = models_json_schema(models, ref_template=SCHEMA_REF)
    schemas: dict[str, dict[str, Any]] = dict(top["$defs"])
    mapping: dict[str, str] = {}
    for event_type, model in PAYLOADS.items():
        name = event_component(model)
        schemas[name] = {
            "title": name,
            "description": schemas[model.__name__]["description"],
            "type": "object",
            "required": ["id", "event", "data"],
            "properties": {
                "id": {
                    "type": "string",
                    "pattern": "^[0-9]+$",
                    "description": "The event's seq in its run (1, 2, ...): reconnect with it "
                    "as Last-Event-ID to get only the events after it.",
                },
                "event": {"type": "string", "const": event_type.value},
                "data": {"$ref": SCHEMA_REF.format(model=model.__name__)},
            },
        }
        mapping[event_type.value] = SCHEMA_REF.format(model=name)
    schemas[RUN_EVENT] = {
        "title": RUN_EVENT,
        "description": "One event of a run's stream; `event` tells its type, and so the "
        "schema of its `data`.",
        "oneOf": [{"$ref": ref} for ref in mapping.values()],
        "discriminator": {"propertyName": "event", "mapping": mapping},
    }
    return schemas


def event_component(model: type[EventData]) -> str:
    """The name of the component describing an event whose payload is `model`."""
    return f"{model.__name__.removesuffix('Data')}Event"


NOTHING_LEFT = (
    "The run is over and nothing is left to send: the client has its terminal event, or its "
    "events are gone (they are kept THREADLINE_EVENT_RETENTION_SECONDS after a run ends). "
    "GET /v1/runs/{id} has its result."
)

# When a POST that starts a run (ask, compact) answers with the run rather than a stream.
RUN_INSTEAD_OF_STREAM = (
    "Also, for stream: true with the Idempotency-Key of a run that is over and whose events are "
    "gone (past THREADLINE_EVENT_RETENTION_SECONDS): that run, as it ended."
)


class NativeWire(Wire):
    """Threadline's own frames: each event as it is stored (its seq, type and payload)."""

    async def frames(self, rows: list[Row]) -> list[bytes]:
        return [frame(row) for row in rows]


async def event_stream(
    hub: EventHub,
    run_id: str,
    after_seq: int,
    heartbeat_seconds: float,
    on_client_gone: Callable[[], Awaitable[None]] | None = None,
    *,
    created: bool = False,
) -> EventSourceResponse | None:
    """The run's events after `after_seq` as SSE, ending with the run (app/eventlog/stream.py);
    None when the run is already over and nothing is left to send: the caller answers without
    a stream (a 204 also stops an EventSource from reconnecting, which an empty 200 would not).
    A run this request has just `created` always has something to send (its `run.created`,
    kept for the retention period): it is not asked."""
    if not created and not await hub.has_more(run_id, after_seq):
        return None
    return run_stream(hub, run_id, after_seq, heartbeat_seconds, NativeWire(), on_client_gone)


def frame(row: dict[str, Any]) -> bytes:
    """A run event as an SSE frame: what sse-starlette's ServerSentEvent(data, event, id)
    encodes, without its line splitting, which none of these fields needs (a seq, a registry
    type, one line of JSON: json.dumps escapes newlines)."""
    data = json.dumps(row["data"], separators=(",", ":"))
    return f"id: {row['seq']}\r\nevent: {row['type']}\r\ndata: {data}\r\n\r\n".encode()


# Past the largest event seq (MAX_EVENT_SEQ): a client that has "everything" may say so. A larger
# resume point is no seq at all: refused like any invalid parameter, before a stream starts.
MAX_RESUME = MAX_EVENT_SEQ + 1
LAST_EVENT_ID = (
    f"The last event seen (its `id:`): resume after it. A value that is not a seq (ASCII "
    f"digits) is ignored; a seq above {MAX_RESUME} answers 422."
)
STARTING_AFTER = "Resume after this seq when there is no Last-Event-ID (e.g. a new EventSource)."


def resume_point(last_event_id: str | None, starting_after: int | None) -> int:
    """Where a reconnecting client resumes: after Last-Event-ID (when it is a seq: ASCII
    digits), else after starting_after. A seq beyond MAX_RESUME raises the same validation
    error (422) as such a starting_after."""
    digits = last_event_id.strip() if last_event_id is not None else ""
    if re.fullmatch(r"[0-9]+", digits):
        value = int(digits)  # at most 32 digits: the header's max_length
        if value > MAX_RESUME:
            raise RequestValidationError(
                [
                    {
                        "type": "less_than_equal",
                        "loc": ("header", "last-event-id"),
                        "msg": f"Input should be less than or equal to {MAX_RESUME}",
                        "input": digits,
                        "ctx": {"le": MAX_RESUME},
                    }
                ]
            )
        return min(value, MAX_EVENT_SEQ)
    return min(starting_after or 0, MAX_EVENT_SEQ)


async def resume_after(
    last_event_id: Annotated[str | None, Header(max_length=32, description=LAST_EVENT_ID)] = None,
    starting_after: Annotated[
        int | None, Query(ge=0, le=MAX_RESUME, description=STARTING_AFTER)
    ] = None,
) -> int:
    """The resume point of a stream request (a dependency: it is validated with the other
    parameters, before the route looks anything up)."""
    return resume_point(last_event_id, starting_after)


ResumeAfter = Annotated[int, Depends(resume_after)]
