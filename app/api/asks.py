"""Routes for asking: commit the user's words, run the model, stream the answer."""

from __future__ import annotations

from uuid import UUID

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse

from app.api.bodies import JSONRoute
from app.api.deps import (
    Config,
    Engine,
    Hub,
    IdempotencyKey,
    OwnLimits,
    Reader,
    Serving,
    Tenant,
)
from app.api.errors import error_responses
from app.api.schemas import AskRequest, Run
from app.api.sse import RUN_INSTEAD_OF_STREAM, SSE_RESPONSE, ResumeAfter, event_stream
from app.core.tool_choice import NamedTool
from app.services import asks as service
from app.services import runs as runs_service

STEER_HEADER = "Threadline-Steer-Id"

router = APIRouter(prefix="/v1/sessions/{session_id}", tags=["runs"], route_class=JSONRoute)


@router.post(
    "/ask",
    operation_id="ask",
    # The JSON answer is the 202 (stream: false); the 200 is the stream (SSE_RESPONSE) alone.
    status_code=202,
    response_model=None,
    responses={
        **SSE_RESPONSE,
        202: {
            "model": Run,
            "description": f"stream: false: the run, queued. {RUN_INSTEAD_OF_STREAM} "
            "A steer (multitask_strategy: steer) answers with the run it steers and names "
            "the steer in the Threadline-Steer-Id header.",
        },
        **error_responses(400, 401, 404, 409, 413, 422),
    },
)
async def ask(
    session_id: UUID,
    body: AskRequest,
    served: Serving,
    tenant: Tenant,
    limits: OwnLimits,
    idempotency_key: IdempotencyKey = None,
) -> Response:
    """Commit the user's entry and start a run; stream its events, or answer 202 with it."""
    engine, settings, hub = served.engine, served.settings, served.hub
    content = (
        body.input
        if isinstance(body.input, str)
        else [p.model_dump(mode="json", exclude_none=True) for p in body.input]
    )
    params = service.AskParams(
        content=content,
        model=body.model,
        context_policy=body.context_policy.model_dump(exclude_none=True)
        if body.context_policy is not None
        else None,
        max_output_tokens=body.max_output_tokens,
        temperature=body.temperature,
        metadata=body.metadata,
        multitask_strategy=body.multitask_strategy,
        on_disconnect=body.on_disconnect,
        run_policy=body.run_policy.model_dump(exclude_unset=True) if body.run_policy else None,
        tools=[t.model_dump(mode="json", exclude_none=True) for t in body.tools or []],
        mcp_servers=list(body.mcp_servers or []),
        tool_choice=body.tool_choice
        if isinstance(body.tool_choice, str)
        else NamedTool(body.tool_choice.name),
        parallel_tool_calls=body.parallel_tool_calls,
        reasoning=body.reasoning.model_dump(exclude_none=True) if body.reasoning else None,
        response_format=body.response_format,
        idempotency_key=idempotency_key,
    )
    result = await service.ask(
        engine,
        settings,
        tenant,
        str(session_id),
        params,
        limits,
        handoff=served.handoff,
        followed=body.stream,
    )
    run_id = result.run.id
    # A steer: the run is the one it steers; the header names the steer, which its run.steered
    # event names too when it lands.
    headers = {STEER_HEADER: result.steer_id} if result.steer_id else None
    if not body.stream:
        run_json = Run.of(result.run).model_dump(mode="json")
        return JSONResponse(run_json, status_code=202, headers=headers)

    async def cancel_run() -> None:
        await runs_service.cancel_run(engine, tenant, run_id)

    # A steer's stream leaving does not cancel the run it steered: that run is not the ask's.
    gone = cancel_run if body.on_disconnect == "cancel" and not result.steer_id else None
    stream = await event_stream(
        hub, run_id, 0, settings.sse_heartbeat_seconds, gone, created=result.created
    )
    if stream is None:  # a repeated Idempotency-Key's run, over and its events gone
        run = await runs_service.get_run(engine, tenant, run_id)
        return JSONResponse(Run.of(run).model_dump(mode="json"), status_code=202)
    stream.headers.update(headers or {})
    return stream


@router.get(
    "/stream",
    operation_id="joinSessionStream",
    status_code=204,  # the answer without a body: the 200 is the stream (SSE_RESPONSE) alone
    response_model=None,
    responses={
        **SSE_RESPONSE,
        204: {"description": "No run is in progress (or it just ended: nothing is left)."},
        **error_responses(401, 403, 404, 422),
    },
)
async def join_stream(
    session_id: UUID,
    engine: Engine,
    reader: Reader,
    settings: Config,
    hub: Hub,
    after: ResumeAfter,
) -> Response:
    """Reattach to the session's active run (e.g. after a page refresh): its events after
    Last-Event-ID (or starting_after), then live ones. With an API key, or a stream token of
    this session as `?token=` (for EventSource)."""
    reader.check_session(str(session_id))
    run = await runs_service.active_run(engine, reader.tenant_id, str(session_id))
    if run is None:
        return Response(status_code=204)
    stream = await event_stream(hub, run.id, after, settings.sse_heartbeat_seconds)
    return stream or Response(status_code=204)
