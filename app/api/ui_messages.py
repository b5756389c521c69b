"""Routes for the AI SDK's `useChat`: its default transport's POST and resume GET, unchanged.

`POST /v1/ui/chat` takes `{id, messages, trigger, messageId}` and answers with the run as a UI
message stream (app/api/ui_stream.py). `GET /v1/ui/chat/{id}/stream` rejoins the chat's active
run from its start, or answers 204 when there is none (`useChat({resume: true})`).
`GET /v1/ui/chat/{id}/messages` is the chat's history as UI messages (app/core/ui_messages.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Path, Response
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.ext.asyncio import AsyncEngine
from sse_starlette import EventSourceResponse

from app.api.bodies import JSONRoute
from app.api.deps import Config, Engine, Hub, LocalWorkers, OwnLimits, Serving, Tenant
from app.api.errors import error_responses
from app.api.ui_stream import (
    CURRENT_MAJOR,
    DONE,
    HEADER,
    VERSION,
    Chunk,
    UIStream,
    context_meter,
)
from app.config import Settings
from app.eventlog.hub import EventHub
from app.eventlog.registry import EventType
from app.eventlog.stream import Row, Wire, run_stream, sse_frame
from app.services import asks as asks_service
from app.services import runs as runs_service
from app.services import ui_chats
from app.services.projection import project_session

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
            "`reasoning-start`, `reasoning-delta`, `reasoning-end`, `tool-input-start`, "
            "`tool-input-delta`, `tool-input-available`, "
            "`tool-output-available`, `tool-output-error`, `tool-approval-request`, "
            "`tool-approval-response`, `tool-output-denied`, `steering-message`, `finish-step`, "
            "`finish`, `error`, `abort`, or a data part: `data-threadline-run`, "
            "`data-threadline-context`, `data-threadline-usage`, `data-threadline-reset`, "
            "`data-threadline-warning`, `data-threadline-steered`.",
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


# The `ai` major a client runs, when it is one that refuses parts of today's protocol: "5"
# (tool approval parts came with `ai` 6), "6" (steering-message with `ai` 7). Set with
# DefaultChatTransport's `headers`.
AiSdkMajor = Annotated[
    str,
    Header(
        alias="Threadline-AI-SDK",
        pattern=r"^(5|6)?$",
        description="`5` for an `ai` 5 client: no tool approval parts (it refuses them); it "
        "sees the calls, and they are ruled on with POST /v1/runs/{id}/approvals. `5` or `6`: "
        "no steering-message parts (`ai` 7's); a steered message is a "
        "`data-threadline-steered` part.",
    ),
]


def major_of(ai_sdk: str) -> int:
    return int(ai_sdk) if ai_sdk else CURRENT_MAJOR


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
    body: UiChatRequest,
    served: Serving,
    tenant: Tenant,
    limits: OwnLimits,
    ai_sdk: AiSdkMajor = "",
) -> Response:
    """Journal the chat's new user message (or regenerate the last answer) and stream the run
    in the AI SDK's UI message stream protocol."""
    engine, settings, hub, local_workers = (
        served.engine,
        served.settings,
        served.hub,
        served.handoff,
    )
    if body.messages and body.messages[-1].get("role") == "assistant":
        # useChat sends the answer back with the outputs of its client-side tools.
        found = await ui_chats.find_session(engine, tenant, body.id)
        if found is None:
            raise ui_chats.no_user_message(body.messages)
        sent = await ui_chats.submit_answers(engine, tenant, found.id, body.messages[-1])
        return _ui_stream(
            engine,
            tenant,
            hub,
            sent.run_id,
            settings.sse_heartbeat_seconds,
            _canceller(engine, tenant, sent.run_id) if body.on_disconnect == "cancel" else None,
            None,
            sent.streamed_through,
            major=major_of(ai_sdk),
        )
    asked = await ui_chats.ask(
        engine,
        settings,
        tenant,
        body.id,
        body.messages,
        regenerate=body.trigger == "regenerate-message",
        edited=body.message_id is not None,
        params=asks_service.AskParams(
            content="", model=body.model, on_disconnect=body.on_disconnect
        ),
        handoff=local_workers,
        own_limits=limits,
    )

    # Only these outlive the request: the ask's result holds the thread it read.
    run, context = asked.run, asked.context

    async def meter() -> Chunk:
        if context is not None:  # the ask's own projection: what the run is sent first
            return context_meter(context.estimated_tokens, context.budget)
        return await _context_meter(engine, settings, tenant, run.session_id, run.model)

    gone = _canceller(engine, tenant, run.id) if body.on_disconnect == "cancel" else None
    return _ui_stream(
        engine,
        tenant,
        hub,
        run.id,
        settings.sse_heartbeat_seconds,
        gone,
        meter,
        major=major_of(ai_sdk),
    )


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
    chat_id: ChatId,
    engine: Engine,
    tenant: Tenant,
    settings: Config,
    hub: Hub,
    ai_sdk: AiSdkMajor = "",
) -> Response:
    """The chat's active run as a UI message stream, from its start: `useChat({resume: true})`
    calls this on load to rejoin a run that a page reload left. Leaving it never cancels."""
    session = await ui_chats.find_session(engine, tenant, chat_id)
    if session is None:
        return Response(status_code=204)
    run = await runs_service.active_run(engine, tenant, session.id)
    if run is None or not await hub.has_more(run.id, 0):
        return Response(status_code=204)
    heartbeat = settings.sse_heartbeat_seconds
    return _ui_stream(engine, tenant, hub, run.id, heartbeat, None, None, major=major_of(ai_sdk))


class UiSteerRequest(BaseModel):
    message: dict[str, Any] = Field(
        description="The user's message as useChat builds it: `{role: user, parts: [...]}` "
        "(its text parts, and file parts for documents and images)."
    )


class UiSteered(BaseModel):
    run_id: str = Field(
        description="The run the message went to (or, with none in progress, "
        "the run it started: stream it with GET /v1/ui/chat/{id}/stream)."
    )
    steer_id: str | None = Field(
        description="The steer, as the stream's steering-message part names it; null when no "
        "run was in progress and the message was asked."
    )


@router.post(
    "/{chat_id:path}/steer",
    operation_id="steerUiChat",
    status_code=202,
    responses=error_responses(400, 401, 404, 409, 413, 422),
)
async def steer_ui_chat(
    chat_id: ChatId,
    body: UiSteerRequest,
    engine: Engine,
    tenant: Tenant,
    settings: Config,
    local_workers: LocalWorkers,
    limits: OwnLimits,
) -> UiSteered:
    """A message sent while the chat's answer streams: the running run's next model turn sees
    it (after its current tool calls), and the stream shows where it landed (a
    `steering-message` part, or `data-threadline-steered` for `ai` 5 and 6 clients). With no
    run in progress it is asked, like a message sent with useChat."""
    result = await ui_chats.steer(
        engine, settings, tenant, chat_id, body.message, local_workers, limits
    )
    return UiSteered(run_id=result.run.id, steer_id=result.steer_id)


class UiChatMessages(BaseModel):
    messages: list[dict[str, Any]] = Field(
        description="The chat's UI messages, oldest first (`useChat({messages})` takes them): "
        "the user's (text, and file parts for documents and images) and one assistant message "
        "per run, its id the run's, with a `step-start` part per model turn, `reasoning` parts "
        "(a redacted block: empty, `providerMetadata.threadline.redacted`), `text` parts and "
        "`tool-<name>` parts with their outputs (a call waiting for approval: state "
        "`approval-requested`, its approval id the call's), `steering-message` parts where a "
        "message sent during the run landed. What a rollback took out is left out."
    )


@router.get(
    "/{chat_id:path}/messages",
    operation_id="uiChatMessages",
    responses=error_responses(401, 422),
)
async def ui_chat_messages(
    chat_id: ChatId, engine: Engine, tenant: Tenant, ai_sdk: AiSdkMajor = ""
) -> UiChatMessages:
    """The chat's history as the AI SDK's UI messages, from the session's journal: what a
    page gives useChat on load. A chat with no session yet has none."""
    found = await ui_chats.chat_messages(engine, tenant, chat_id, major_of(ai_sdk))
    return UiChatMessages(messages=found)


class _UIWire(Wire):
    """The run's events as UI message chunks; `[DONE]` after the terminal one, or once the run
    waits for client-side tool outputs. The `meter`'s part (worked out meanwhile) follows the
    run's first chunks. Events up to `sent_through` were streamed before (the client continues
    that message): they are translated, for the ids, but not sent."""

    def __init__(
        self,
        engine: AsyncEngine,
        tenant: str,
        run_id: str,
        meter: Callable[[], Coroutine[Any, Any, Chunk]] | None,
        sent_through: int,
        major: int,
    ) -> None:
        self._engine = engine
        self._tenant = tenant
        self._run_id = run_id
        self._stream = UIStream(run_id, major)
        self._sent_through = sent_through
        self._measuring: asyncio.Task[Chunk] | None = (
            asyncio.create_task(meter()) if meter is not None else None
        )

    def opening(self) -> list[bytes]:
        return [_sse({"type": "start", "messageId": self._run_id})] if self._sent_through else []

    async def frames(self, rows: list[Row]) -> list[bytes]:
        out: list[bytes] = []
        for row in rows:
            if self.ended:
                break
            out += await self._row(row)
        return out

    async def _row(self, row: Row) -> list[bytes]:
        stream, run_id = self._stream, self._run_id
        if row["seq"] <= self._sent_through:
            stream.translate(row["type"], row["data"])  # sent before: for the ids
            return []
        if row["type"] == EventType.RUN_REQUIRES_ACTION and await ui_chats.events_after(
            self._engine, run_id, row["seq"]
        ):
            # A replayed wait the client answered already: the calls with their outputs.
            outputs = await ui_chats.client_tool_outputs(self._engine, self._tenant, run_id)
            return [_sse(chunk) for chunk in stream.answered(row["data"], outputs)]
        out = [_sse(chunk) for chunk in stream.translate(row["type"], row["data"])]
        if stream.waiting:  # for the browser's tool outputs: useChat sends them anew
            self.ended = True
            return out
        if self._measuring is not None:
            try:
                out.append(_sse(await self._measuring))
            except Exception:  # a meter is no reason to fail the stream
                log.warning("run %s: no context meter", run_id, exc_info=True)
            self._measuring = None
        return out

    def closing(self) -> list[bytes]:
        return [sse_frame(DONE)]

    def close(self) -> None:
        if self._measuring is not None:
            self._measuring.cancel()


def _ui_stream(
    engine: AsyncEngine,
    tenant: str,
    hub: EventHub,
    run_id: str,
    heartbeat_seconds: float,
    on_client_gone: Callable[[], Awaitable[None]] | None,
    meter: Callable[[], Coroutine[Any, Any, Chunk]] | None,
    sent_through: int = 0,
    *,
    major: int,
) -> EventSourceResponse:
    """The run's events from its first, as a UI message stream (_UIWire)."""
    wire = _UIWire(engine, tenant, run_id, meter, sent_through, major)
    return run_stream(
        hub, run_id, 0, heartbeat_seconds, wire, on_client_gone, headers={HEADER: VERSION}
    )


def _sse(chunk: Chunk) -> bytes:
    return sse_frame(json.dumps(chunk, separators=(",", ":")))
