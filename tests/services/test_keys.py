"""API keys through the service and the database: issue, find, list, revoke, rotate (with and
without a grace period), and the per-request lookup that counts requests per minute."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.config import Settings
from app.services import keys, quotas
from app.services.errors import Invalid, NotFound


def _tenant() -> str:
    return f"k-{uuid.uuid4()}"


async def test_a_key_is_kept_as_its_hash_and_listed_without_it(engine: AsyncEngine) -> None:
    tenant = _tenant()
    issued = await keys.issue_key(engine, tenant, "ci", read_only=True)
    assert issued.key.startswith("tl_") and issued.info.prefix == issued.key[:12]
    async with engine.connect() as conn:
        stored = (
            (
                await conn.execute(
                    text("SELECT * FROM api_keys WHERE id = :id"), {"id": issued.info.id}
                )
            )
            .mappings()
            .one()
        )
    assert issued.key not in {str(v) for v in stored.values()}
    assert stored["key_hash"] == keys.hash_key(issued.key)
    listed = await keys.list_keys(engine, tenant)
    assert listed == [issued.info]
    assert listed[0].read_only and listed[0].name == "ci" and listed[0].revoked_at is None
    with pytest.raises(NotFound):
        await keys.list_keys(engine, _tenant())  # no such tenant


async def test_find_by_id_prefix_or_whole_key(engine: AsyncEngine) -> None:
    issued = await keys.issue_key(engine, _tenant())
    for ref in (issued.info.id, issued.info.prefix, issued.key):
        assert (await keys.find_key(engine, ref)).id == issued.info.id
    with pytest.raises(NotFound):
        await keys.find_key(engine, "tl_nothing")
    with pytest.raises(NotFound):
        await keys.find_key(engine, str(uuid.uuid4()))
    with pytest.raises(NotFound):  # another tenant's
        await keys.find_key(engine, issued.info.prefix, tenant_name=_tenant())


async def test_an_ambiguous_prefix_names_the_candidates(engine: AsyncEngine) -> None:
    tenant = _tenant()
    first, second = await keys.issue_key(engine, tenant), await keys.issue_key(engine, tenant)
    async with engine.begin() as conn:  # two keys listed alike (older keys had 8 characters)
        await conn.execute(
            text("UPDATE api_keys SET prefix = 'tl_same' WHERE id IN (:a, :b)"),
            {"a": first.info.id, "b": second.info.id},
        )
    with pytest.raises(Invalid) as refused:
        await keys.find_key(engine, "tl_same")
    assert refused.value.code == "ambiguous_key"
    assert sorted(refused.value.details["ids"]) == sorted([first.info.id, second.info.id])


async def test_revoked_keys_are_refused_at_once(engine: AsyncEngine) -> None:
    issued = await keys.issue_key(engine, _tenant())
    assert await keys.authenticate(engine, issued.key, None) is not None
    revoked = await keys.revoke_key(engine, issued.info.id)
    assert revoked.revoked_at is not None
    assert await keys.authenticate(engine, issued.key, None) is None
    assert await keys.tenant_for_key(engine, issued.key) is None
    again = await keys.revoke_key(engine, issued.info.id)  # a no-op: the first time stands
    assert again.revoked_at == revoked.revoked_at
    with pytest.raises(NotFound):
        await keys.revoke_key(engine, str(uuid.uuid4()))


async def test_rotate_keeps_name_and_scope_and_revokes_the_old_key(engine: AsyncEngine) -> None:
    tenant = _tenant()
    old = await keys.issue_key(engine, tenant, "deploy", read_only=True)
    new = await keys.rotate_key(engine, old.info.id)
    assert (new.info.name, new.info.read_only, new.info.tenant) == ("deploy", True, tenant)
    assert new.key != old.key
    assert await keys.authenticate(engine, old.key, None) is None
    caller = await keys.authenticate(engine, new.key, None)
    assert caller is not None and caller.read_only
    with pytest.raises(Invalid):  # a revoked key is not rotated again
        await keys.rotate_key(engine, old.info.id)


async def test_rotate_with_a_grace_period_keeps_the_old_key_until_then(
    engine: AsyncEngine,
) -> None:
    old = await keys.issue_key(engine, _tenant())
    new = await keys.rotate_key(engine, old.info.id, grace_seconds=3600)
    assert await keys.authenticate(engine, old.key, None) is not None
    assert await keys.authenticate(engine, new.key, None) is not None
    listed = {k.id: k for k in await keys.list_keys(engine, old.info.tenant)}
    assert listed[old.info.id].revoked_at is not None  # scheduled
    await keys.revoke_key(engine, old.info.id)  # revoking now overrides the grace period
    assert await keys.authenticate(engine, old.key, None) is None
    assert await keys.authenticate(engine, new.key, None) is not None


async def test_last_use_is_recorded(engine: AsyncEngine) -> None:
    issued = await keys.issue_key(engine, _tenant())
    assert issued.info.last_used_at is None
    await keys.authenticate(engine, issued.key, None)
    (listed,) = await keys.list_keys(engine, issued.info.tenant)
    assert listed.last_used_at is not None


async def test_requests_per_minute_count_exactly_under_concurrency(
    engine: AsyncEngine, settings: Settings
) -> None:
    """Every lookup counts once: of 30 concurrent requests at a limit of 7, exactly 7 pass
    (unless a minute ends during the burst: then each window passes at most 7, tried again)."""
    for _ in range(5):
        tenant = _tenant()
        key = await keys.create_key(engine, tenant)
        await quotas.set_limits(engine, settings, tenant, {"requests_per_minute": 7})
        minute = text("SELECT date_trunc('minute', now())")
        async with engine.connect() as conn:
            before = await conn.scalar(minute)
        callers = await asyncio.gather(*(keys.authenticate(engine, key, None) for _ in range(30)))
        async with engine.connect() as conn:
            after = await conn.scalar(minute)
        passed = [c for c in callers if c is not None and not c.over_rate]
        if before != after:
            assert len(passed) <= 14
            continue
        assert len(passed) == 7
        counts = sorted(c.rpm_count or 0 for c in callers if c is not None)
        assert counts == list(range(1, 31))  # each request counted once
        refused = [c for c in callers if c is not None and c.over_rate]
        assert all(c.retry_after is not None and 1 <= c.retry_after <= 60 for c in refused)
        return
    pytest.fail("every burst straddled a minute")


async def test_no_counting_without_a_limit(engine: AsyncEngine) -> None:
    tenant = _tenant()
    key = await keys.create_key(engine, tenant)
    caller = await keys.authenticate(engine, key, None)
    assert caller is not None and caller.rpm_limit is None and caller.rpm_count is None
    async with engine.connect() as conn:
        rows = await conn.scalar(
            text(
                "SELECT count(*) FROM tenant_request_counts c JOIN tenants t"
                " ON t.id = c.tenant_id WHERE t.name = :n"
            ),
            {"n": tenant},
        )
    assert rows == 0
    limited = await keys.authenticate(engine, key, 100)  # the server's default applies
    assert limited is not None and limited.rpm_limit == 100 and limited.rpm_count == 1
