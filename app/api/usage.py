"""GET /v1/usage: the caller's tenant's tokens and cost per UTC day and model."""

from __future__ import annotations

from datetime import date
from typing import Annotated

from fastapi import APIRouter, Query

from app.api.admin_schemas import UsageReport
from app.api.bodies import JSONRoute
from app.api.deps import Engine, Tenant
from app.api.errors import error_responses
from app.services import quotas
from app.services.errors import Invalid

router = APIRouter(prefix="/v1/usage", tags=["usage"], route_class=JSONRoute)

# A day as YYYY-MM-DD only (pydantic would also take a number as a timestamp).
DAY_PATTERN = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$"
From = Annotated[
    str | None,
    Query(
        alias="from",
        pattern=DAY_PATTERN,
        description="First UTC day, YYYY-MM-DD (default: 29 days before `to`).",
    ),
]
To = Annotated[
    str | None,
    Query(
        alias="to",
        pattern=DAY_PATTERN,
        description="Last UTC day, YYYY-MM-DD, included (default: today).",
    ),
]


def parse_day(value: str | None, name: str) -> date | None:
    if value is None:
        return None
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise Invalid(
            "invalid_date", f"{name} is not a date: {value}", {"loc": ["query", name]}
        ) from None


@router.get("", operation_id="getUsage", responses=error_responses(401, 422))
async def get_usage(
    engine: Engine, tenant: Tenant, start: From = None, end: To = None
) -> UsageReport:
    """Tokens and cost of the tenant's runs per UTC day and model (the day a run ended), from
    what the providers reported; kept when sessions are deleted. At most 366 days."""
    report = await quotas.usage_report(
        engine,
        tenant_id=tenant,
        start=parse_day(start, "from"),
        end=parse_day(end, "to"),
    )
    return UsageReport.of(report)
