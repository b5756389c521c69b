"""The key cache (app/services/key_cache.py): what it keeps and forgets, and, with a real event
hub listening on the test database, that a known key needs no statement and that every change
to a key or its tenant's limits, made by any path, reaches it."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from app.config import Settings
from app.db.engine import libpq_url
from app.eventlog.hub import EventHub
from app.services import keys
from app.services.key_cache import KeyCache, KnownKey
from app.services.quotas import Limits


def known(tenant: str = "t", **changes: object) -> KnownKey:
    values: dict[str, object] = {
        "tenant_id": tenant,
        "read_only": False,
        "rpm_limit": None,
        "limits": Limits(),
        "revoked_at": None,
        "read_at": time.monotonic(),
    }
    return KnownKey(**{**values, **changes})  # type: ignore[arg-type]


def listening_cache(max_age: float = 60) -> KeyCache:
    cache = KeyCache(max_age)
    cache.connected()
    return cache


def test_nothing_is_kept_or_trusted_while_not_listening() -> None:
    cache = KeyCache()
    cache.put("h", known(), cache.generation)
    assert cache.get("h") is None
    cache.connected()
    cache.put("h", known(), cache.generation)
    assert cache.get("h") is not None
    cache.disconnected()
    assert cache.get("h") is None
    cache.connected()  # back: what was kept before is gone
    assert cache.get("h") is None


def test_a_read_that_began_before_a_change_is_not_kept() -> None:
    cache = listening_cache()
    began = cache.generation
    cache.notified("another tenant")  # whichever tenant: the read may have raced it
    cache.put("h", known(), began)
    assert cache.get("h") is None


def test_a_notification_forgets_its_tenants_keys_only() -> None:
    cache = listening_cache()
    for key_hash, tenant in (("a1", "a"), ("a2", "a"), ("b1", "b")):
        cache.put(key_hash, known(tenant), cache.generation)
    cache.notified("a")
    assert (cache.get("a1"), cache.get("a2")) == (None, None)
    assert cache.get("b1") is not None


def test_an_entry_lapses_with_age_and_at_the_end_of_a_grace_period() -> None:
    cache = listening_cache(max_age=60)
    cache.put("old", known(read_at=time.monotonic() - 61), cache.generation)
    past = datetime.now(UTC) - timedelta(seconds=1)
    cache.put("graced", known(revoked_at=past), cache.generation)
    future = datetime.now(UTC) + timedelta(hours=1)
    cache.put("graced later", known(revoked_at=future), cache.generation)
    assert cache.get("old") is None and cache.get("graced") is None
    assert cache.get("graced later") is not None


@pytest.fixture
async def cache(engine: AsyncEngine, settings: Settings) -> AsyncIterator[KeyCache]:
    """A key cache kept by a real event hub's LISTEN on the test database."""
    assert settings.database_url is not None
    cache = KeyCache()
    hub = EventHub(engine, libpq_url(settings.database_url), listeners=[cache])
    await hub.start()
    try:
        await until(lambda: cache.listening)
        yield cache
    finally:
        await hub.stop()


async def until(check: object) -> None:
    deadline = time.monotonic() + 60
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "never happened"
        await asyncio.sleep(0.01)


@pytest.fixture
async def unreachable() -> AsyncIterator[AsyncEngine]:
    """An engine whose every statement fails: nothing listens on port 1."""
    engine = create_async_engine("postgresql+asyncpg://nobody@127.0.0.1:1/none")
    yield engine
    await engine.dispose()


async def test_a_known_key_needs_no_statement(
    engine: AsyncEngine, cache: KeyCache, unreachable: AsyncEngine
) -> None:
    issued = await keys.issue_key(engine, f"c-{uuid.uuid4()}", read_only=True)
    first = await keys.authenticate(engine, issued.key, None, cache)
    assert first is not None and first.read_only

    again = await keys.authenticate(unreachable, issued.key, None, cache)

    assert again == first
    with pytest.raises(OSError):  # an unknown key does go to the database
        await keys.authenticate(unreachable, "tl_unknown", None, cache)


async def test_a_revocation_by_sql_reaches_the_cache(engine: AsyncEngine, cache: KeyCache) -> None:
    issued = await keys.issue_key(engine, f"c-{uuid.uuid4()}")
    assert await keys.authenticate(engine, issued.key, None, cache) is not None
    async with engine.begin() as conn:  # as an operator would, by hand
        await conn.execute(
            text("UPDATE api_keys SET revoked_at = now() WHERE id = :id"), {"id": issued.info.id}
        )

    await until(lambda: cache.get(keys.hash_key(issued.key)) is None)
    assert await keys.authenticate(engine, issued.key, None, cache) is None


async def test_a_use_of_the_key_is_no_change(engine: AsyncEngine, cache: KeyCache) -> None:
    """last_used_at is written as keys are used: the cache keeps the key through it.
    Notifications arrive in commit order, so once one sent after the write is heard, any the
    write sent would have been heard too."""
    used = await keys.issue_key(engine, f"c-{uuid.uuid4()}")
    sentinel = await keys.issue_key(engine, f"c-{uuid.uuid4()}")
    for issued in (used, sentinel):
        assert await keys.authenticate(engine, issued.key, None, cache) is not None
    sentinel_tenant = (await keys.authenticate(engine, sentinel.key, None, cache)).tenant_id  # type: ignore[union-attr]
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE api_keys SET last_used_at = now() - interval '1 hour' WHERE id = :id"),
            {"id": used.info.id},
        )
    async with engine.begin() as conn:
        await conn.execute(
            text("SELECT pg_notify('threadline_keys', :tenant)"), {"tenant": sentinel_tenant}
        )

    await until(lambda: cache.get(keys.hash_key(sentinel.key)) is None)
    assert cache.get(keys.hash_key(used.key)) is not None


async def test_new_limits_reach_the_cache_and_a_limited_tenant_is_counted(
    engine: AsyncEngine, cache: KeyCache, unreachable: AsyncEngine
) -> None:
    tenant = f"c-{uuid.uuid4()}"
    issued = await keys.issue_key(engine, tenant)
    before = await keys.authenticate(engine, issued.key, None, cache)
    assert before is not None and before.limits == Limits() and before.rpm_count is None
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO tenant_limits (tenant_id, requests_per_minute, max_sessions)"
                " VALUES (:tenant, 100, 3)"
            ),
            {"tenant": before.tenant_id},
        )

    await until(lambda: cache.get(keys.hash_key(issued.key)) is None)
    after = await keys.authenticate(engine, issued.key, None, cache)
    assert after is not None and after.limits.max_sessions == 3 and after.rpm_limit == 100
    counted = await keys.authenticate(engine, issued.key, None, cache)  # known, and counted
    assert counted is not None and counted.rpm_count == (after.rpm_count or 0) + 1
    with pytest.raises(OSError):  # counting is a statement
        await keys.authenticate(unreachable, issued.key, None, cache)
