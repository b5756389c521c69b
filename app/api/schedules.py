"""Routes for schedules: cron asks in a session, or in a new session from an agent each time."""

from __future__ import annotations

from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Query, Response

from app.api.bodies import JSONRoute
from app.api.deps import Engine, Tenant
from app.api.errors import error_responses
from app.api.schemas import (
    Schedule,
    ScheduleAsk,
    ScheduleCreate,
    ScheduleList,
    ScheduleRun,
    ScheduleRunList,
    ScheduleUpdate,
)
from app.db import schedules as schedules_db
from app.services import schedules as service

router = APIRouter(tags=["schedules"], route_class=JSONRoute)


def _schedule(s: schedules_db.Schedule) -> Schedule:
    return Schedule(
        id=s.id,
        name=s.name,
        cron=s.cron,
        timezone=s.timezone,
        ask=ScheduleAsk.model_validate(s.ask),
        session_id=s.session_id,
        agent=s.agent,
        agent_version=s.agent_version,
        title_template=s.title_template,
        misfire=s.misfire,
        busy=s.busy,
        enabled=s.enabled,
        next_due_at=s.next_due_at,
        created_at=s.created_at,
        updated_at=s.updated_at,
    )


def _values(body: ScheduleCreate | ScheduleUpdate, given: set[str]) -> dict[str, Any]:
    values = body.model_dump(mode="json", include=given)
    if body.ask is not None and "ask" in given:
        values["ask"] = body.ask.model_dump(mode="json", exclude_none=True)
    return values


@router.post(
    "/v1/schedules",
    operation_id="createSchedule",
    status_code=201,
    responses=error_responses(400, 401, 404, 413, 422),
)
async def create_schedule(body: ScheduleCreate, engine: Engine, tenant: Tenant) -> Schedule:
    """Ask on a cron schedule: in `session_id`, or in a new session from `agent` each time."""
    values = _values(body, set(ScheduleCreate.model_fields))
    return _schedule(await service.create_schedule(engine, tenant, values))


@router.get("/v1/schedules", operation_id="listSchedules", responses=error_responses(401, 422))
async def list_schedules(engine: Engine, tenant: Tenant) -> ScheduleList:
    return ScheduleList(data=[_schedule(s) for s in await service.list_schedules(engine, tenant)])


@router.get(
    "/v1/schedules/{schedule_id}",
    operation_id="getSchedule",
    responses=error_responses(401, 404, 422),
)
async def get_schedule(schedule_id: UUID, engine: Engine, tenant: Tenant) -> Schedule:
    return _schedule(await service.get_schedule(engine, tenant, str(schedule_id)))


@router.patch(
    "/v1/schedules/{schedule_id}",
    operation_id="updateSchedule",
    responses=error_responses(400, 401, 404, 413, 422),
)
async def update_schedule(
    schedule_id: UUID, body: ScheduleUpdate, engine: Engine, tenant: Tenant
) -> Schedule:
    """The fields given replace the schedule's (a null is no change); `enabled` turns it on
    or off."""
    given = {k for k in body.model_fields_set if getattr(body, k) is not None}
    values = _values(body, given)
    return _schedule(await service.update_schedule(engine, tenant, str(schedule_id), values))


@router.delete(
    "/v1/schedules/{schedule_id}",
    operation_id="deleteSchedule",
    status_code=204,
    responses=error_responses(401, 404, 422),
)
async def delete_schedule(schedule_id: UUID, engine: Engine, tenant: Tenant) -> Response:
    """Gone with its firings' records; the sessions and runs it made stay."""
    await service.delete_schedule(engine, tenant, str(schedule_id))
    return Response(status_code=204)


@router.get(
    "/v1/schedules/{schedule_id}/runs",
    operation_id="listScheduleRuns",
    responses=error_responses(401, 404, 422),
)
async def list_runs(
    schedule_id: UUID,
    engine: Engine,
    tenant: Tenant,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> ScheduleRunList:
    """Its past due times, newest first: each one's run and its status, or why none ran."""
    firings = await service.list_firings(engine, tenant, str(schedule_id), limit)
    return ScheduleRunList(
        data=[
            ScheduleRun(
                due_at=f.due_at,
                status=f.status,
                reason=f.reason,
                message=f.message,
                session_id=f.session_id,
                run_id=f.run_id,
                run_status=f.run_status,
                created_at=f.created_at,
            )
            for f in firings
        ]
    )
