"""Routes for the AI SDK's `useChat`: its default transport's POST and resume GET, unchanged.

`POST /v1/ui/chat` takes `{id, messages, trigger, messageId}` and answers with the run as a UI
message stream (app/api/ui_stream.py). `GET /v1/ui/chat/{id}/stream` rejoins the chat's active
run from its start, or answers 204 when there is none (`useChat({resume: true})`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Response
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.ext.asyncio import AsyncEngine
from sse_starlette import EventSourceResponse, ServerSentEvent

from app.api.bodies import JSONRoute
from app.api.deps import Config, Engine, Hub, Tenant
from app.api.errors import error_responses
from app.api.ui_stream import DONE, HEADER, VERSION, Chunk, UIStream, context_meter
from app.config import Settings
from app.eventlog.hub import EventHub
from app.eventlog.registry import EventType
from app.services import asks as asks_service
from app.services import runs as runs_service
from app.services import ui_chats
from app.services.errors import Invalid
from app.services.projection import project_session
from app.telemetry import metrics

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1/ui/chat", tags=["ai-sdk"], route_class=JSONRoute)

# The `data:` of each event but the last (`[DONE]`): the AI SDK's chunk types Threadline sends.
UI_CHUNK_SCHEMA: dict[str, Any] = {
    "title": "UIMessageChunk",
    "description": "One chunk of the AI SDK's UI message stream protocol (v1), as JSON.",
    "type": "object",
    "required": ["type"],
    "properties": {
        "type": {
            "type": "string",
            "description": "`start`, `start-step`, `text-start`, `text-delta`, `text-end`, "
            "`tool-input-start`, `tool-input-delta`, `tool-input-available`, "
            "`tool-output-available`, `tool-output-error`, `finish-step`, `finish`, `error`, "
            "`abort`, or a data part: `data-threadline-run`, `data-threadline-context`, "
            "`data-threadline-usage`, `data-threadline-reset`.",
        }
    },
    "additionalProperties": True,
}
UI_STREAM_RESPONSE: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The run as an AI SDK UI message stream (text/event-stream, header "
        f"`{HEADER}: {VERSION}`): one JSON chunk per `data:` line, then `data: {DONE}`.",
        "content": {"text/event-stream": {"schema": UI_CHUNK_SCHEMA}},
    }
}
ChatId = Annotated[
    str, Path(min_length=1, max_length=ui_chats.MAX_CHAT_ID_LENGTH, description="The chat's id.")
]


class UiChatRequest(BaseModel):
    """What the AI SDK's DefaultChatTransport sends (its `body` option adds fields)."""

    model_config = ConfigDict(extra="allow")

    id: str = Field(
        min_length=1,
        max_length=ui_chats.MAX_CHAT_ID_LENGTH,
        description="The chat's id. The id of one of your sessions is that session; any other "
        "id names a session made for the chat on its first message.",
    )
    messages: list[dict[str, Any]] = Field(
        description="The chat's UI messages. Only the last one, the user's new message, is "
        "read (its text parts); the session's journal holds the conversation."
    )
    trigger: Literal["submit-message", "regenerate-message"] = Field(
        default="submit-message",
        description="`regenerate-message`: roll back the last answer (and the user message it "
        "answers) and ask that message again.",
    )
    message_id: str | None = Field(
        default=None,
        alias="messageId",
        description="With `submit-message`: the user message was edited (useChat's "
        "`sendMessage({text, messageId})`): it and everything after it are rolled back before "
        "the edited text is asked. With `regenerate-message`: the answer regenerated.",
    )
    model: str | None = Field(default=None, description="The model to answer with.")
    on_disconnect: Literal["cancel", "continue"] = Field(
        default="cancel",
        description="`cancel` (the default): the client stopping (aborting the request) "
        "cancels the run. `continue`: the run goes on, for clients that resume after a reload.",
    )


@router.post(
    "",
    operation_id="uiChat",
    response_model=None,
    response_class=EventSourceResponse,  # the 200 is the stream alone (no JSON variant)
    responses={**UI_STREAM_RESPONSE, **error_responses(400, 401, 404, 409, 413, 422)},
)
async def ui_chat(
    body: UiChatRequest, engine: Engine, tenant: Tenant, settings: Config, hub: Hub
) -> Response:
    """Journal the chat's new user message (or regenerate the last answer) and stream the run
    in the AI SDK's UI message stream protocol."""
    content: str | list[dict[str, Any]] | None
    if body.messages and body.messages[-1].get("role") == "assistant":
        # useChat sends the answer back with the outputs of its client-side tools.
        found = await ui_chats.find_session(engine, tenant, body.id)
        if found is None:
            raise ui_chats.no_user_message(body.messages)
        sent = await ui_chats.submit_tool_outputs(
            engine, tenant, str(found["id"]), body.messages[-1]
        )
        return _ui_stream(
            engine,
            tenant,
            hub,
            sent.run_id,
            settings.sse_heartbeat_seconds,
            _canceller(engine, tenant, sent.run_id) if body.on_disconnect == "cancel" else None,
            None,
            sent.streamed_through,
        )
    # Before the rollback or the new chat's session: a refused ask leaves nothing behind.
    await asks_service.check_quotas(engine, settings, tenant)
    if body.trigger == "regenerate-message":
        session = await ui_chats.find_session(engine, tenant, body.id)
        nothing = Invalid("nothing_to_regenerate", "the chat has no user message yet", {})
        if session is None:
            raise nothing
        session_id = str(session["id"])
        content = await ui_chats.roll_back_from(engine, tenant, session_id, None, "regenerate")
        if content is None:
            raise nothing
    else:
        content = ui_chats.new_user_text(body.messages)
        session_id = str((await ui_chats.chat_session(engine, settings, tenant, body.id))["id"])
        if body.message_id is not None:
            # An edit: useChat sends the messages up to the edited one, which is last. It is
            # the chat's n-th user message: that one and all after it are rolled back.
            position = sum(1 for m in body.messages if m.get("role") == "user") - 1
            await ui_chats.roll_back_from(engine, tenant, session_id, position, "edit")
    params = asks_service.AskParams(
        content=content, model=body.model, on_disconnect=body.on_disconnect
    )
    run = (await asks_service.ask(engine, settings, tenant, session_id, params)).run

    async def meter() -> Chunk:
        return await _context_meter(engine, settings, tenant, session_id, run.model)

    gone = _canceller(engine, tenant, run.id) if body.on_disconnect == "cancel" else None
    return _ui_stream(engine, tenant, hub, run.id, settings.sse_heartbeat_seconds, gone, meter)


def _canceller(engine: AsyncEngine, tenant: str, run_id: str) -> Callable[[], Awaitable[None]]:
    async def cancel_run() -> None:
        await runs_service.cancel_run(engine, tenant, run_id)

    return cancel_run


async def _context_meter(
    engine: AsyncEngine, settings: Settings, tenant: str, session_id: str, model: str
) -> Chunk:
    """The context meter at the start of a run: what its first model call is sent."""
    projected = await project_session(engine, settings, tenant, session_id, model=model)
    meta = projected.projection.meta
    return context_meter(meta.estimated_tokens, meta.budget)


@router.get(
    "/{chat_id:path}/stream",  # :path: the AI SDK escapes a "/" in a chat id, uvicorn unescapes
    operation_id="resumeUiChat",
    response_model=None,
    response_class=EventSourceResponse,
    responses={
        **UI_STREAM_RESPONSE,
        204: {"description": "The chat has no run in progress (or no session yet)."},
        **error_responses(401, 422),
    },
)
async def resume_ui_chat(
    chat_id: ChatId, engine: Engine, tenant: Tenant, settings: Config, hub: Hub
) -> Response:
    """The chat's active run as a UI message stream, from its start: `useChat({resume: true})`
    calls this on load to rejoin a run that a page reload left. Leaving it never cancels."""
    session = await ui_chats.find_session(engine, tenant, chat_id)
    if session is None:
        return Response(status_code=204)
    run = await runs_service.active_run(engine, tenant, str(session["id"]))
    if run is None or not await hub.has_more(run.id, 0):
        return Response(status_code=204)
    return _ui_stream(engine, tenant, hub, run.id, settings.sse_heartbeat_seconds, None, None)


def _ui_stream(
    engine: AsyncEngine,
    tenant: str,
    hub: EventHub,
    run_id: str,
    heartbeat_seconds: float,
    on_client_gone: Callable[[], Awaitable[None]] | None,
    meter: Callable[[], Coroutine[Any, Any, Chunk]] | None,
    sent_through: int = 0,
) -> EventSourceResponse:
    """The run's events from its first, translated; `[DONE]` after the terminal one, or once
    the run waits for client-side tool outputs. The `meter`'s part (worked out meanwhile)
    follows the run's first chunks. Events up to `sent_through` were streamed before (the
    client continues that message): they are translated, for the ids, but not sent."""

    async def chunks() -> AsyncIterator[ServerSentEvent]:
        stream = UIStream(run_id)
        finished = False
        measuring: asyncio.Task[Chunk] | None = (
            asyncio.create_task(meter()) if meter is not None else None
        )
        try:
            if sent_through:
                yield _sse({"type": "start", "messageId": run_id})
            async for row in hub.follow(run_id, 0):
                if row["seq"] <= sent_through:
                    stream.translate(row["type"], row["data"])  # sent before: for the ids
                    continue
                if row["type"] == EventType.RUN_REQUIRES_ACTION and await ui_chats.events_after(
                    engine, run_id, row["seq"]
                ):
                    # A replayed wait the client answered already: the calls with their outputs.
                    outputs = await ui_chats.client_tool_outputs(engine, tenant, run_id)
                    for chunk in stream.answered(row["data"], outputs):
                        yield _sse(chunk)
                    continue
                for chunk in stream.translate(row["type"], row["data"]):
                    yield _sse(chunk)
                if stream.waiting:  # for the browser's tool outputs: useChat sends them anew
                    break
                if measuring is not None:
                    try:
                        yield _sse(await measuring)
                    except Exception:  # a meter is no reason to fail the stream
                        log.warning("run %s: no context meter", run_id, exc_info=True)
                    measuring = None
            finished = True
            yield ServerSentEvent(data=DONE)
        except Exception:
            finished = True  # ours (as in app/api/sse.py): dropped, not a reason to cancel
            raise
        finally:
            if measuring is not None:
                measuring.cancel()
            # sse-starlette ends the generator with CancelledError when the client leaves.
            if not finished and on_client_gone is not None:
                await asyncio.shield(on_client_gone())

    return EventSourceResponse(
        metrics.counted_stream(chunks()),
        ping=heartbeat_seconds,
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", HEADER: VERSION},
    )


def _sse(chunk: Chunk) -> ServerSentEvent:
    return ServerSentEvent(data=json.dumps(chunk, separators=(",", ":")))
