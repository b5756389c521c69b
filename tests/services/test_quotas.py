"""Limits through the service: the server's defaults apply where a tenant sets none, a
tenant's own limit overrides them, and None sets it back to the default."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from app.config import Settings
from app.services import quotas
from app.services.errors import Invalid, LimitExceeded, NotFound
from app.services.keys import create_key, tenant_for_key
from app.services.sessions import create_session


async def test_defaults_apply_where_the_tenant_sets_none(
    engine: AsyncEngine, settings: Settings
) -> None:
    tenant = f"q-{uuid.uuid4()}"
    tenant_id = await tenant_for_key(engine, await create_key(engine, tenant))
    assert tenant_id is not None
    defaults = settings.model_copy(update={"default_max_sessions": 2, "default_rpm": 100})
    shown = await quotas.get_limits(engine, defaults, tenant)
    assert shown.own == quotas.Limits()
    assert shown.effective == quotas.Limits(requests_per_minute=100, max_sessions=2)

    for _ in range(2):
        await create_session(
            engine, tenant_id, title=None, metadata={}, config={}, settings=defaults
        )
    with pytest.raises(LimitExceeded) as refused:
        await create_session(
            engine, tenant_id, title=None, metadata={}, config={}, settings=defaults
        )
    assert refused.value.code == "session_limit" and refused.value.retry_after >= 1
    assert refused.value.details == {
        "limit_name": "max_sessions",
        "limit": 2,
        "current": 2,
        "reset": None,
    }

    own = await quotas.set_limits(engine, defaults, tenant, {"max_sessions": 3})
    assert own.effective.max_sessions == 3 and own.effective.requests_per_minute == 100
    await create_session(engine, tenant_id, title=None, metadata={}, config={}, settings=defaults)
    back = await quotas.set_limits(engine, defaults, tenant, {"max_sessions": None})
    assert back.own == quotas.Limits() and back.effective.max_sessions == 2
    unlimited = await quotas.get_limits(engine, settings, tenant)  # no defaults configured
    assert unlimited.effective == quotas.Limits()


async def test_bad_limits_are_refused(engine: AsyncEngine, settings: Settings) -> None:
    tenant = f"q-{uuid.uuid4()}"
    await create_key(engine, tenant)
    with pytest.raises(Invalid):
        await quotas.set_limits(engine, settings, tenant, {"max_sessions": -1})
    with pytest.raises(Invalid):
        await quotas.set_limits(engine, settings, tenant, {"sessions": 1})
    with pytest.raises(NotFound):
        await quotas.set_limits(engine, settings, f"nobody-{uuid.uuid4()}", {})


def test_report_ranges() -> None:
    today = quotas.report_range(None, None)
    assert (today[1] - today[0]).days == 29
    with pytest.raises(Invalid):
        quotas.report_range(today[1], today[0].replace(year=today[0].year - 1))
    with pytest.raises(Invalid):
        quotas.report_range(today[1].replace(year=today[1].year - 2), today[1])
