"""Schedules: cron asks of a tenant, and the tick that fires the due ones exactly once.

A firing is an ordinary ask (app/services/asks.py): its firing row, unique per (schedule, due
time), the schedule's next due time and, for an agent target, the new session are written by
the ask's `prepare`, in the transaction that commits the ask. A second worker firing the same
due time finds the row there and writes nothing. A refused ask (a busy session under
busy=skip, a quota, a deleted session) is recorded as a skipped or failed firing and the
schedule moves on to its next due time: never retried, so no storm of asks.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.config import Settings
from app.core import schedules as core
from app.core.agents import AgentPin
from app.db import schedules as schedules_db
from app.db import sessions as sessions_db
from app.services import agents as agents_service
from app.services import asks, quotas
from app.services.errors import Invalid, NotFound, ServiceError, session_not_found
from app.services.sessions import pinned

log = logging.getLogger(__name__)

# Schedules a tick looks at, at most (the next tick takes the rest).
TICK_BATCH = 100


def schedule_not_found(schedule_id: str) -> NotFound:
    return NotFound(
        "schedule_not_found", f"no schedule {schedule_id}", {"schedule_id": schedule_id}
    )


def zone_of(name: str) -> ZoneInfo:
    """The IANA time zone `name`; 422 invalid_timezone if there is none."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise Invalid(
            "invalid_timezone",
            f"unknown time zone {name!r} (an IANA name such as Europe/Berlin)",
            {"loc": ["body", "timezone"], "timezone": name},
        ) from None


def _check(values: dict[str, Any]) -> ZoneInfo:
    """422 for an invalid cron expression, time zone or title template; the zone."""
    problem = core.cron_problem(values["cron"])
    if problem is not None:
        raise Invalid(
            "invalid_cron",
            f"invalid cron expression {values['cron']!r}: {problem}",
            {"loc": ["body", "cron"], "cron": values["cron"]},
        )
    zone = zone_of(values["timezone"])
    template = values.get("title_template")
    if template is not None:
        problem = core.title_problem(template)
        if problem is not None:
            raise Invalid(
                "invalid_title_template",
                f"invalid title template: {problem}",
                {"loc": ["body", "title_template"]},
            )
    return zone


async def _check_target(conn: AsyncConnection, tenant_id: str, values: dict[str, Any]) -> None:
    if values.get("session_id") is not None:
        if await sessions_db.get_session(conn, tenant_id, values["session_id"]) is None:
            raise session_not_found(values["session_id"])
    else:
        await agents_service.version_in(conn, tenant_id, values["agent"], values["agent_version"])


async def create_schedule(
    engine: AsyncEngine, tenant_id: str, values: dict[str, Any], now: datetime | None = None
) -> schedules_db.Schedule:
    """`values`: the schedules row's own fields (name, cron, timezone, misfire, busy, enabled,
    session_id or agent [agent_version, title_template], ask)."""
    zone = _check(values)
    now = now or datetime.now(UTC)
    async with engine.begin() as conn:
        await _check_target(conn, tenant_id, values)
        return await schedules_db.insert_schedule(
            conn,
            tenant_id=tenant_id,
            next_due_at=core.next_due(values["cron"], zone, now),
            **values,
        )


async def get_schedule(
    engine: AsyncEngine, tenant_id: str, schedule_id: str
) -> schedules_db.Schedule:
    async with engine.connect() as conn:
        found = await schedules_db.get_schedule(conn, tenant_id, schedule_id)
    if found is None:
        raise schedule_not_found(schedule_id)
    return found


async def list_schedules(engine: AsyncEngine, tenant_id: str) -> list[schedules_db.Schedule]:
    async with engine.connect() as conn:
        return await schedules_db.list_schedules(conn, tenant_id)


async def update_schedule(
    engine: AsyncEngine,
    tenant_id: str,
    schedule_id: str,
    changes: dict[str, Any],
    now: datetime | None = None,
) -> schedules_db.Schedule:
    """The fields given replace the schedule's. A new cron or time zone, or enabling it, sets
    its next due time from now: times missed while disabled are not fired."""
    now = now or datetime.now(UTC)
    async with engine.begin() as conn:
        found = await schedules_db.get_schedule(conn, tenant_id, schedule_id, lock=True)
        if found is None:
            raise schedule_not_found(schedule_id)
        merged = {
            "cron": found.cron,
            "timezone": found.timezone,
            "title_template": found.title_template,
            "session_id": found.session_id,
            "agent": found.agent,
            "agent_version": found.agent_version,
            **changes,
        }
        zone = _check(merged)
        agent_only = {"agent_version", "title_template"} & changes.keys()
        if found.agent is None and agent_only:
            raise Invalid(
                "invalid_schedule",
                f"{sorted(agent_only)[0]} goes with an agent's schedule; this one asks in a "
                "session",
                {"loc": ["body", sorted(agent_only)[0]]},
            )
        if {"session_id", "agent", "agent_version"} & changes.keys():
            await _check_target(conn, tenant_id, merged)
        values = dict(changes)
        if (
            "cron" in changes
            or "timezone" in changes
            or (changes.get("enabled") and not found.enabled)
        ):
            values["next_due_at"] = core.next_due(merged["cron"], zone, now)
        return await schedules_db.update_schedule(conn, schedule_id, values)


async def delete_schedule(engine: AsyncEngine, tenant_id: str, schedule_id: str) -> None:
    async with engine.begin() as conn:
        if not await schedules_db.delete_schedule(conn, tenant_id, schedule_id):
            raise schedule_not_found(schedule_id)


async def list_firings(
    engine: AsyncEngine, tenant_id: str, schedule_id: str, limit: int
) -> list[schedules_db.ScheduleFiring]:
    async with engine.connect() as conn:
        if await schedules_db.get_schedule(conn, tenant_id, schedule_id) is None:
            raise schedule_not_found(schedule_id)
        return await schedules_db.list_firings(conn, schedule_id, limit)


class _AlreadyFired(Exception):
    """Another worker fired (or recorded) this due time first: this tick writes nothing."""


@dataclass(frozen=True)
class Fired:
    schedule_id: str
    due_at: datetime
    status: str  # fired | skipped | failed
    run_id: str | None = None


async def fire_due(
    engine: AsyncEngine, settings: Settings, now: datetime | None = None
) -> list[Fired]:
    """One tick: every enabled schedule due by `now` fired (or its firing recorded skipped or
    failed) once. Safe to run in any number of workers at once."""
    now = now or datetime.now(UTC)
    async with engine.connect() as conn:
        due = await schedules_db.due_schedule_ids(conn, now, TICK_BATCH)
    done = []
    for schedule_id in due:
        try:
            fired = await fire(engine, settings, schedule_id, now)
        except Exception:
            log.exception("firing schedule %s failed", schedule_id)
            continue
        if fired is not None:
            done.append(fired)
    return done


async def _claim(
    conn: AsyncConnection, schedule: schedules_db.Schedule, firing: core.Firing, **values: Any
) -> None:
    """In the transaction that acts on the due time: the firing row, and the schedule moved
    to its next due time; _AlreadyFired if another worker got there first."""
    locked = await schedules_db.get_schedule(conn, None, schedule.id, lock=True)
    if locked is None or not locked.enabled or locked.next_due_at != schedule.next_due_at:
        raise _AlreadyFired
    if not await schedules_db.insert_firing(conn, schedule.id, firing.due_at, **values):
        raise _AlreadyFired
    await schedules_db.advance(conn, schedule.id, firing.next_due_at)


async def fire(
    engine: AsyncEngine, settings: Settings, schedule_id: str, now: datetime
) -> Fired | None:
    """The schedule's due time acted on once (see the module); None when it is not due, or
    another worker acted on it."""
    async with engine.connect() as conn:
        schedule = await schedules_db.get_schedule(conn, None, schedule_id)
    if schedule is None or not schedule.enabled:
        return None
    zone = zone_of(schedule.timezone)
    grace = timedelta(seconds=settings.schedule_misfire_grace_seconds)
    firing = core.firing(schedule.cron, zone, schedule.misfire, schedule.next_due_at, now, grace)
    if firing is None:
        return None
    if not firing.fire:
        message = "missed while no worker ran (misfire: skip)"
        return await _record(engine, schedule, firing, "skipped", "misfired", message, None)
    run_id = str(uuid.uuid4())
    session_id = schedule.session_id or str(uuid.uuid4())

    async def prepare(conn: AsyncConnection) -> None:
        await _claim(conn, schedule, firing, status="fired", run_id=run_id, session_id=session_id)
        if schedule.agent is not None:
            await _new_session(conn, settings, schedule, session_id, firing, zone)

    try:
        await asks.ask(
            engine,
            settings,
            schedule.tenant_id,
            session_id,
            _ask_params(schedule, run_id),
            prepare=prepare,
        )
    except _AlreadyFired:
        return None
    except ServiceError as refused:
        status = "skipped" if refused.code == "session_busy" else "failed"
        target = schedule.session_id
        return await _record(
            engine, schedule, firing, status, refused.code, refused.message, target
        )
    return Fired(schedule.id, firing.due_at, "fired", run_id)


async def _record(
    engine: AsyncEngine,
    schedule: schedules_db.Schedule,
    firing: core.Firing,
    status: str,
    reason: str,
    message: str,
    session_id: str | None,
) -> Fired | None:
    """A due time that started no run, recorded (its reason visible in the runs list)."""
    try:
        async with engine.begin() as conn:
            values = {"status": status, "reason": reason, "message": message}
            await _claim(conn, schedule, firing, **values, session_id=session_id)
    except _AlreadyFired:
        return None
    return Fired(schedule.id, firing.due_at, status)


async def _new_session(
    conn: AsyncConnection,
    settings: Settings,
    schedule: schedules_db.Schedule,
    session_id: str,
    firing: core.Firing,
    zone: ZoneInfo,
) -> None:
    assert schedule.agent is not None
    version = await agents_service.version_in(
        conn, schedule.tenant_id, schedule.agent, schedule.agent_version
    )
    await quotas.check_new_session(conn, settings, schedule.tenant_id)
    title = (
        core.render_title(schedule.title_template, firing.due_at, zone, schedule.name)
        if schedule.title_template is not None
        else None
    )
    await sessions_db.insert_session(
        conn,
        id=session_id,
        tenant_id=schedule.tenant_id,
        title=title,
        metadata={"schedule_id": schedule.id},
        config={},
        **pinned(AgentPin(version.agent_id, version.name, version.version, version.config)),
        expires_at=sessions_db.tenant_default_expiry(schedule.tenant_id),
    )


def _ask_params(schedule: schedules_db.Schedule, run_id: str) -> asks.AskParams:
    ask = schedule.ask
    return asks.AskParams(
        content=ask["input"],
        model=ask.get("model"),
        context_policy=ask.get("context_policy"),
        max_output_tokens=ask.get("max_output_tokens"),
        temperature=ask.get("temperature"),
        metadata={**ask.get("metadata", {}), "schedule_id": schedule.id},
        run_policy=ask.get("run_policy"),
        reasoning=ask.get("reasoning"),
        # busy=queue: after the run in progress; skip: refused (session_busy), recorded.
        multitask_strategy="enqueue" if schedule.busy == "queue" else "reject",
        run_id=run_id,
    )
