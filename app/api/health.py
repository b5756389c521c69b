"""Liveness and readiness probes."""

from __future__ import annotations

import asyncio
import os

import asyncpg
from fastapi import APIRouter
from fastapi.responses import JSONResponse
from sqlalchemy.exc import SQLAlchemyError

from app.api.bodies import JSONRoute
from app.api.deps import Engine
from app.api.errors import error_json, error_responses, unavailable
from app.api.schemas import Health
from app.db.migrate import current_revision, head_revision

READY_TIMEOUT_SECONDS = 5.0

router = APIRouter(tags=["health"], route_class=JSONRoute)


@router.get("/healthz", operation_id="healthz")
async def healthz() -> Health:
    """The process is up."""
    return Health(status="ok", process=os.getpid())


@router.get("/readyz", operation_id="readyz", response_model=Health, responses=error_responses(503))
async def readyz(engine: Engine) -> Health | JSONResponse:
    """The database answers and its schema is at the migrations' head."""
    try:
        # An unreachable host could keep a connect waiting a minute: a probe answers sooner.
        async with asyncio.timeout(READY_TIMEOUT_SECONDS), engine.connect() as conn:
            revision = await current_revision(conn)
    except (SQLAlchemyError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        return unavailable(f"the database cannot be reached now ({type(exc).__name__})")
    head = head_revision()
    if revision != head:
        return error_json(
            503,
            "migrations_pending",
            "the database schema is not at the migrations' head",
            {"current": revision, "head": head},
        )
    return Health(status="ready", database="ok", revision=revision)
