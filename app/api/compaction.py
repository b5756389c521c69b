"""POST /compact: queue a compaction job that appends a summary checkpoint."""

from __future__ import annotations

from uuid import UUID

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse

from app.api.bodies import JSONRoute
from app.api.deps import Config, Engine, Hub, IdempotencyKey, Tenant
from app.api.errors import error_responses
from app.api.schemas import CompactRequest, Run
from app.api.sse import RUN_INSTEAD_OF_STREAM, SSE_RESPONSE, event_stream
from app.services import compaction as service
from app.services import runs as runs_service

router = APIRouter(prefix="/v1/sessions/{session_id}", tags=["context"], route_class=JSONRoute)


@router.post(
    "/compact",
    operation_id="compactSession",
    status_code=202,
    response_model=None,
    responses={
        202: {
            "model": Run,
            "description": f"stream: false: the compaction run, queued. {RUN_INSTEAD_OF_STREAM}",
        },
        **SSE_RESPONSE,
        **error_responses(400, 401, 404, 409, 413, 422),
    },
)
async def compact(
    session_id: UUID,
    body: CompactRequest,
    engine: Engine,
    tenant: Tenant,
    settings: Config,
    hub: Hub,
    idempotency_key: IdempotencyKey = None,
) -> Response:
    """Summarize the history since the last checkpoint, up to the turns kept raw, into a new
    `summary` entry (incremental: the previous summary is folded in). Runs as a job, after any
    run in progress: follow it with `GET /v1/runs/{id}/events` (context.compacting, then
    context.compacted or a failure) or wait with `GET /v1/runs/{id}?wait=true`. 409
    `nothing_to_compact` when only the kept turns exist."""
    params = service.CompactParams(
        focus=body.focus,
        keep_last_turns=body.keep_last_turns,
        model=body.model,
        idempotency_key=idempotency_key,
    )
    run, _ = await service.request_compaction(engine, settings, tenant, str(session_id), params)
    if not body.stream:
        return JSONResponse(Run.of(run).model_dump(mode="json"), status_code=202)
    stream = await event_stream(hub, run.id, 0, settings.sse_heartbeat_seconds)
    if stream is None:  # a repeated Idempotency-Key's run, over and its events gone
        run = await runs_service.get_run(engine, tenant, run.id)
        return JSONResponse(Run.of(run).model_dump(mode="json"), status_code=202)
    return stream
