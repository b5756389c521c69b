"""GET /metrics: Prometheus exposition, outside the authenticated API (not in its OpenAPI
document); open, or behind its own token (THREADLINE_METRICS_TOKEN)."""

from __future__ import annotations

import hmac

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from app.api.bodies import JSONRoute
from app.api.deps import Engine, get_settings
from app.api.errors import Refusal
from app.db.jobs import waiting_jobs
from app.telemetry.metrics import exposition

router = APIRouter(include_in_schema=False, route_class=JSONRoute)


@router.get("/metrics")
async def metrics(request: Request, engine: Engine) -> Response:
    settings = await get_settings(request)
    if not settings.metrics_enabled:
        raise Refusal(404, "not_found", "metrics are off (THREADLINE_METRICS_ENABLED=false)")
    if settings.metrics_token is not None:
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        expected = settings.metrics_token.encode()
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected):
            raise Refusal(
                401,
                "unauthorized",
                "send Authorization: Bearer <THREADLINE_METRICS_TOKEN>",
                {"WWW-Authenticate": "Bearer"},
            )
    async with engine.connect() as conn:
        queues = await waiting_jobs(conn)
    return Response(exposition(queues), media_type=CONTENT_TYPE_LATEST)
