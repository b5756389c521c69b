"""Routes for runs: status, event stream (replay + live), cancel, client tool outputs, and
tool approvals."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Query, Response

from app.api.bodies import JSONRoute
from app.api.deps import Config, Engine, Hub, Reader, Tenant
from app.api.errors import error_responses
from app.api.schemas import ApprovalsRequest, Run, RunApprovals, ToolOutputsRequest
from app.api.sse import NOTHING_LEFT, SSE_RESPONSE, ResumeAfter, event_stream
from app.core.runs import WAITING
from app.eventlog.registry import EventType
from app.services import approvals
from app.services import runs as service

router = APIRouter(prefix="/v1/runs/{run_id}", tags=["runs"], route_class=JSONRoute)


@router.get("", operation_id="getRun", responses=error_responses(401, 404, 422))
async def get_run(
    run_id: UUID,
    engine: Engine,
    tenant: Tenant,
    hub: Hub,
    wait: Annotated[
        bool,
        Query(
            description="Block until the run has ended, or has stopped to wait for tool "
            "outputs or an approval (a run already waiting is waited on until it ends)."
        ),
    ] = False,
    wait_seconds: Annotated[
        float, Query(alias="timeout", gt=0, le=600, description="Most seconds to wait.")
    ] = 60,
) -> Run:
    """Status, usage and result of a run; with `wait=true`, once it has ended or stopped to
    wait for the caller (or timed out)."""
    run = await service.get_run(engine, tenant, str(run_id))
    if wait and run.active:
        # A run found waiting already is waited on until it ends (someone else may answer it).
        stops = run.status not in WAITING
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(
                _until_settled(hub, engine, tenant, str(run_id), stops), wait_seconds
            )
        run = await service.get_run(engine, tenant, str(run_id))
    return Run.of(run)


PAUSES = frozenset({EventType.RUN_REQUIRES_ACTION, EventType.RUN_AWAITING_APPROVAL})


async def _until_settled(
    hub: Hub, engine: Engine, tenant: Tenant, run_id: str, stops: bool
) -> None:
    """Until the run's terminal event; with `stops`, also until it waits for tool outputs or
    an approval (a pause replayed from before, since answered, does not count)."""
    async for row in hub.follow(run_id):
        if stops and row["type"] in PAUSES:
            run = await service.get_run(engine, tenant, run_id)
            if run.status in WAITING:
                return


@router.get(
    "/events",
    operation_id="streamRunEvents",
    status_code=204,  # the answer without a body: the 200 is the stream (SSE_RESPONSE) alone
    response_model=None,
    responses={
        **SSE_RESPONSE,
        204: {"description": NOTHING_LEFT},
        **error_responses(401, 403, 404, 422),
    },
)
async def run_events(
    run_id: UUID,
    engine: Engine,
    reader: Reader,
    settings: Config,
    hub: Hub,
    after: ResumeAfter,
) -> Response:
    """Every event after Last-Event-ID (or starting_after) exactly once, then live ones; the
    stream ends after the terminal event. 204 when the run is over and nothing is left to send.
    With an API key, or a stream token of this run or its session as `?token=` (for
    EventSource)."""
    run = await service.get_run(engine, reader.tenant_id, str(run_id))  # 404 for others' runs
    reader.check_run(run)
    stream = await event_stream(hub, str(run_id), after, settings.sse_heartbeat_seconds)
    return stream or Response(status_code=204)


@router.post("/cancel", operation_id="cancelRun", responses=error_responses(401, 404, 422))
async def cancel(run_id: UUID, engine: Engine, tenant: Tenant) -> Run:
    """Stop a run: its partial answer is committed marked incomplete; it ends `cancelled`."""
    return Run.of(await service.cancel_run(engine, tenant, str(run_id)))


@router.get("/approvals", operation_id="listRunApprovals", responses=error_responses(401, 404, 422))
async def list_approvals(run_id: UUID, engine: Engine, tenant: Tenant) -> RunApprovals:
    """The run's tool calls that wait (or waited) for a person's approval, and its status."""
    return RunApprovals.of(await approvals.run_approvals(engine, tenant, str(run_id)))


@router.post(
    "/approvals",
    operation_id="answerRunApprovals",
    responses=error_responses(400, 401, 404, 409, 413, 422),
)
async def answer_approvals(
    run_id: UUID, body: ApprovalsRequest, engine: Engine, tenant: Tenant
) -> RunApprovals:
    """Approve (maybe with edited arguments) or reject calls the run waits on. Partial answers
    are kept; once no call waits the run resumes: approved calls run (each at most once),
    rejected ones get the reason as their result. 409 when the run is not waiting or a call
    was answered already."""
    answers = [
        approvals.Answer(a.tool_call_id, a.decision == "approve", a.arguments, a.reason)
        for a in body.approvals
    ]
    return RunApprovals.of(await approvals.answer(engine, tenant, str(run_id), answers))


@router.post(
    "/tool_outputs",
    operation_id="submitToolOutputs",
    responses=error_responses(400, 401, 404, 409, 413, 422),
)
async def tool_outputs(
    run_id: UUID, body: ToolOutputsRequest, engine: Engine, tenant: Tenant
) -> Run:
    """Results of client-side tools, one per call the run waits on; the run then resumes."""
    outputs = [service.ToolOutput(o.tool_call_id, o.output, o.is_error) for o in body.tool_outputs]
    return Run.of(await service.submit_tool_outputs(engine, tenant, str(run_id), outputs))
