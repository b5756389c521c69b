"""Liveness and readiness: /readyz tells a reachable, migrated database from the rest."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from app.config import Settings
from app.main import create_app
from testkit.server import free_port


async def call(settings: Settings, path: str) -> httpx.Response:
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.get(path)


async def test_healthz_and_readyz(settings: Settings) -> None:
    assert (await call(settings, "/healthz")).json() == {
        "status": "ok",
        "database": None,
        "revision": None,
        "process": os.getpid(),  # the app is served in this process here
    }
    ready = await call(settings, "/readyz")
    assert ready.status_code == 200 and ready.json()["status"] == "ready"


@pytest.fixture
async def empty_database(engine: AsyncEngine, settings: Settings) -> AsyncIterator[str]:
    name = f"empty_{uuid.uuid4().hex[:8]}"
    async with engine.connect() as conn:
        await conn.execution_options(isolation_level="AUTOCOMMIT")
        await conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    assert settings.database_url is not None
    base, _, query = settings.database_url.partition("?")
    yield f"{base.rsplit('/', 1)[0]}/{name}" + (f"?{query}" if query else "")
    async with engine.connect() as conn:
        await conn.execution_options(isolation_level="AUTOCOMMIT")
        await conn.exec_driver_sql(f'DROP DATABASE "{name}" WITH (FORCE)')


async def test_readyz_is_503_before_migrations(empty_database: str) -> None:
    response = await call(Settings(database_url=empty_database), "/readyz")
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "migrations_pending"


async def test_readyz_is_503_without_database() -> None:
    unreachable = Settings(database_url=f"postgresql://nobody@127.0.0.1:{free_port()}/none")
    response = await call(unreachable, "/readyz")
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "database_unavailable"
    assert (await call(unreachable, "/healthz")).status_code == 200
