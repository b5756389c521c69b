"""The OpenAI Responses and Conversations API at /openai/v1, for the official `openai` SDKs:
`OpenAI(base_url=".../openai/v1", api_key=<a Threadline key>)`.

Streams are the Responses API's events (`event:` the type, `data:` the event as JSON, with its
`sequence_number`), translated from the run's events (app/openai_api/events.py): a replay
(`GET /responses/{id}?stream=true&starting_after=N`) yields the same events.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Response
from fastapi.responses import JSONResponse
from sqlalchemy.ext.asyncio import AsyncEngine
from sse_starlette import EventSourceResponse, ServerSentEvent

from app.api.deps import Config, Engine, Hub, OwnLimits, Serving, Tenant, get_tenant
from app.eventlog.hub import EventHub
from app.eventlog.stream import Row, Wire, run_stream, sse_frame
from app.openai_api import service
from app.openai_api.errors import OpenAIError, OpenAIRoute, unsupported
from app.openai_api.events import ResponseStream, ended_stream
from app.openai_api.objects import Json
from app.openai_api.schemas import (
    ConversationCreate,
    ConversationUpdate,
    ItemsCreate,
    ResponseCreate,
)
from app.services import runs

PREFIX = "/openai/v1"
# Not in Threadline's OpenAPI document: OpenAI's API reference describes this prefix, and its
# clients are the openai SDKs, not clients generated from that document.
router = APIRouter(prefix=PREFIX, tags=["openai"], route_class=OpenAIRoute, include_in_schema=False)

Order = Annotated[Literal["asc", "desc"], Query(description="By position: desc (newest first).")]
Limit = Annotated[int, Query(ge=1, le=100)]


# What completes a streamed response's output, once it ended (the journal has it all then).
Settle = Callable[[list[Json]], Awaitable[list[Json]]]
ENDED_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})


class _ResponseWire(Wire):
    """The run's events as the Responses API's events (each with its sequence_number), those
    after `starting_after`; over once the response is (the run ended, or waits for the
    outputs of its function calls)."""

    def __init__(
        self, stream: ResponseStream, starting_after: int, settle: Settle | None = None
    ) -> None:
        self._stream = stream
        self._after = starting_after
        self._settle = settle

    async def frames(self, rows: list[Row]) -> list[bytes]:
        out: list[bytes] = []
        for row in rows:
            if self.ended:
                break
            for event in self._stream.translate(row["type"], row["data"]):
                if event["sequence_number"] <= self._after:
                    continue
                if self._settle is not None and event["type"] in ENDED_EVENTS:
                    event["response"]["output"] = await self._settle(event["response"]["output"])
                out.append(_frame(event))
            self.ended = self._stream.done
        return out


def _frame(event: Json) -> bytes:
    return sse_frame(json.dumps(event, separators=(",", ":")), event["type"])


def _sse(
    hub: EventHub,
    stream: ResponseStream,
    starting_after: int,
    heartbeat: float,
    on_client_gone: Callable[[], Awaitable[Any]] | None = None,
    settle: Settle | None = None,
) -> EventSourceResponse:
    wire = _ResponseWire(stream, starting_after, settle)
    return run_stream(hub, stream.run_id, 0, heartbeat, wire, on_client_gone)


def _with_encrypted(engine: AsyncEngine, tenant_id: str, response_id: str) -> Settle:
    """The ended response's reasoning items with their opaque content (include), which the
    run's events do not carry: read from the journal."""

    async def settle(output: list[Json]) -> list[Json]:
        return await service.with_encrypted_reasoning(engine, tenant_id, response_id, output)

    return settle


async def _replayed(events: list[Json]) -> AsyncIterator[ServerSentEvent]:
    for event in events:
        yield ServerSentEvent(data=json.dumps(event, separators=(",", ":")), event=event["type"])


@router.post(
    "/responses",
    operation_id="openaiCreateResponse",
    response_model=None,
)
async def create_response(
    body: ResponseCreate,
    served: Serving,
    tenant: Tenant,
    limits: OwnLimits,
) -> Response:
    """Answer the input in a conversation: a new one, the one of `previous_response_id` (or
    a fork of it at that response), or `conversation`. Streams with `stream: true`; answers
    at once, queued, with `background: true`; else once the response has ended."""
    engine, settings, hub, local_workers = (
        served.engine,
        served.settings,
        served.hub,
        served.handoff,
    )
    created = await service.create_response(engine, settings, tenant, body, local_workers, limits)
    loaded, base = created.loaded, created.base
    if body.stream:
        stream = service.stream_of(loaded, base)
        run_id = loaded.run.id

        async def cancel_run() -> None:  # a response not in the background ends with its stream
            await runs.cancel_run(engine, tenant, run_id)

        # (one whose input steered a response in progress leaves that response's run be)
        gone = None if base["background"] or loaded.steered else cancel_run
        settle = _with_encrypted(engine, tenant, loaded.id) if created.encrypted else None
        return _sse(hub, stream, -1, settings.sse_heartbeat_seconds, gone, settle)
    if not body.background:
        await service.until_done(hub, loaded)
    loaded = await service.load(engine, tenant, loaded.id)
    return JSONResponse(await service.current(engine, loaded, base, encrypted=created.encrypted))


@router.get(
    "/responses/{response_id}",
    operation_id="openaiGetResponse",
    response_model=None,
)
async def get_response(
    response_id: str,
    engine: Engine,
    tenant: Tenant,
    settings: Config,
    hub: Hub,
    stream: bool = False,
    starting_after: Annotated[int, Query(ge=-1)] = -1,
    include: Annotated[list[str] | None, Query()] = None,
    # The openai SDKs send a list as include[]=...
    include_listed: Annotated[list[str] | None, Query(alias="include[]")] = None,
) -> Response:
    """The response as it is now; with `stream=true`, its events (after `starting_after`),
    replayed then live."""
    encrypted = service.encrypted_included([*(include or []), *(include_listed or [])])
    loaded = await service.load(engine, tenant, response_id)
    if stream:
        if not await hub.has_more(loaded.run.id, 0):  # over, and its events are gone
            ended = ended_stream(await service.current(engine, loaded, encrypted=encrypted))
            return EventSourceResponse(
                _replayed([e for e in ended if e["sequence_number"] > starting_after])
            )
        response_stream = service.stream_of(loaded, service.base_of(loaded))
        settle = _with_encrypted(engine, tenant, loaded.id) if encrypted else None
        heartbeat = settings.sse_heartbeat_seconds
        return _sse(hub, response_stream, starting_after, heartbeat, None, settle)
    return JSONResponse(await service.current(engine, loaded, encrypted=encrypted))


@router.post(
    "/responses/{response_id}/cancel",
    operation_id="openaiCancelResponse",
)
async def cancel_response(response_id: str, engine: Engine, tenant: Tenant, hub: Hub) -> Json:
    """Stop the response's run; what it had said is kept, marked incomplete."""
    return await service.cancel_response(engine, hub, tenant, response_id)


@router.delete(
    "/responses/{response_id}",
    operation_id="openaiDeleteResponse",
)
async def delete_response(response_id: str, engine: Engine, tenant: Tenant) -> Json:
    """Take the response out of its conversation's context (a rollback: the journal keeps
    it); it is not found after."""
    await service.delete_response(engine, tenant, response_id)
    return {"id": response_id, "object": "response", "deleted": True}


def _page(data: list[Json], has_more: bool) -> Json:
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": has_more,
    }


@router.get(
    "/responses/{response_id}/input_items",
    operation_id="openaiListInputItems",
)
async def list_input_items(
    response_id: str,
    engine: Engine,
    tenant: Tenant,
    order: Order = "desc",
    limit: Limit = 20,
    after: str | None = None,
) -> Json:
    """The items the response took as input (its message, or the function call outputs)."""
    found = await service.input_items(engine, tenant, response_id)
    if order == "desc":
        found.reverse()
    if after is not None:
        ids = [i["id"] for i in found]
        found = found[ids.index(after) + 1 :] if after in ids else []
    return _page(found[:limit], len(found) > limit)


@router.post(
    "/conversations",
    operation_id="openaiCreateConversation",
)
async def create_conversation(body: ConversationCreate, engine: Engine, tenant: Tenant) -> Json:
    """A new conversation (a session), with its first items."""
    return await service.create_conversation(engine, tenant, body.items, body.metadata)


@router.get(
    "/conversations/{conversation_id}",
    operation_id="openaiGetConversation",
)
async def get_conversation(conversation_id: str, engine: Engine, tenant: Tenant) -> Json:
    return await service.get_conversation(engine, tenant, conversation_id)


@router.post("/conversations/{conversation_id}", operation_id="openaiUpdateConversation")
async def update_conversation(
    conversation_id: str, body: ConversationUpdate, engine: Engine, tenant: Tenant
) -> Json:
    """Replace the conversation's metadata."""
    return await service.update_conversation(engine, tenant, conversation_id, body.metadata)


@router.get(
    "/conversations/{conversation_id}/items/{item_id}", operation_id="openaiGetConversationItem"
)
async def get_item(conversation_id: str, item_id: str, engine: Engine, tenant: Tenant) -> Json:
    return await service.get_item(engine, tenant, conversation_id, item_id)


@router.delete(
    "/conversations/{conversation_id}/items/{item_id}",
    operation_id="openaiDeleteConversationItem",
    dependencies=[Depends(get_tenant)],  # a stranger is told to authenticate first
)
async def delete_item(conversation_id: str, item_id: str) -> Json:
    """Refused: items are journal entries, never deleted."""
    raise OpenAIError(
        400,
        "Items are entries of the conversation's journal and are never deleted: delete a "
        "response to take it out of the conversation's context.",
        param="item_id",
        code="unsupported_operation",
    )


@router.delete(
    "/conversations/{conversation_id}",
    operation_id="openaiDeleteConversation",
)
async def delete_conversation(conversation_id: str, engine: Engine, tenant: Tenant) -> Json:
    """Delete the conversation's session (its forks keep what they share)."""
    return await service.delete_conversation(engine, tenant, conversation_id)


@router.get(
    "/conversations/{conversation_id}/items",
    operation_id="openaiListConversationItems",
)
async def list_items(
    conversation_id: str,
    engine: Engine,
    tenant: Tenant,
    order: Order = "desc",
    limit: Limit = 20,
    after: str | None = None,
    include: Annotated[list[str] | None, Query()] = None,
) -> Json:
    """The conversation's messages, function calls and outputs, a page at a time."""
    if include:
        raise unsupported("include")
    page = await service.list_items(
        engine, tenant, conversation_id, after=after, limit=limit, order=order
    )
    return _page(page.data, page.has_more)


@router.post(
    "/conversations/{conversation_id}/items",
    operation_id="openaiCreateConversationItems",
)
async def add_items(
    conversation_id: str,
    body: ItemsCreate,
    engine: Engine,
    tenant: Tenant,
    include: Annotated[list[str] | None, Query()] = None,
) -> Json:
    """Append items (messages, function calls and outputs) to the conversation."""
    if include:
        raise unsupported("include")
    added = await service.add_items(engine, tenant, conversation_id, body.items)
    return _page(added, False)
