"""What counts as an outage (app.db.outage), and what a client sees during one: 503
database_unavailable with Retry-After, never a 500. The whole story, with a real server whose
database stops and starts again, is tests/api/test_database_outage.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import httpx
import pytest
from sqlalchemy import exc as sa
from sqlalchemy import text

from app.config import Settings
from app.db.engine import create_engine
from app.db.outage import database_unavailable
from app.main import create_app
from testkit.server import free_port


class _Orig(Exception):
    def __init__(self, sqlstate: str) -> None:
        super().__init__(f"sqlstate {sqlstate}")
        self.sqlstate = sqlstate


def _wrapped(sqlstate: str) -> sa.DBAPIError:
    return sa.DBAPIError("SELECT 1", {}, _Orig(sqlstate))


@pytest.mark.parametrize(
    ("error", "outage"),
    [
        (_wrapped("08006"), True),  # connection failure
        (_wrapped("08001"), True),
        (_wrapped("57P01"), True),  # admin shutdown
        (_wrapped("57P02"), True),  # crash shutdown
        (_wrapped("57P03"), True),  # cannot connect now: starting up
        (_wrapped("53300"), True),  # too many connections
        (asyncpg.exceptions.CannotConnectNowError("starting up"), True),
        (asyncpg.exceptions.ConnectionDoesNotExistError("closed mid-operation"), True),
        (asyncpg.exceptions.InterfaceError("connection is closed"), True),
        (sa.DisconnectionError("ping failed"), True),
        (sa.TimeoutError("QueuePool limit reached"), True),
        (_wrapped("22P05"), False),  # a value Postgres cannot store: the request's fault
        (_wrapped("23505"), False),  # a unique violation
        (_wrapped("40001"), False),  # a serialization failure
        (asyncpg.exceptions.InterfaceError("another operation is in progress"), False),
        (ValueError("a bug"), False),
        (ConnectionRefusedError("not raised by a driver"), False),
    ],
)
def test_what_counts_as_an_outage(error: BaseException, outage: bool) -> None:
    assert database_unavailable(error) is outage


async def test_an_outage_is_recognised_however_it_is_wrapped() -> None:
    """A failed connect lets the socket's own error through the driver; a task group wraps
    errors in a group; a service re-raises with its own cause."""
    unreachable = Settings(database_url=f"postgresql://nobody@127.0.0.1:{free_port()}/none")
    engine = create_engine(unreachable)
    try:
        with pytest.raises(OSError) as raised:
            async with engine.connect() as conn:
                await conn.execute(text("SELECT 1"))
    finally:
        await engine.dispose()
    assert database_unavailable(raised.value)
    assert database_unavailable(RuntimeError("in a service")) is False
    try:
        raise RuntimeError("in a service") from raised.value
    except RuntimeError as chained:
        assert database_unavailable(chained)
    assert database_unavailable(ExceptionGroup("task group", [ValueError(), raised.value]))
    assert not database_unavailable(ExceptionGroup("task group", [ValueError()]))


@pytest.fixture
async def down() -> AsyncIterator[httpx.AsyncClient]:
    """The API on a database that is not there (nothing listens on its port)."""
    app = create_app(Settings(database_url=f"postgresql://nobody@127.0.0.1:{free_port()}/none"))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        headers = {"Authorization": "Bearer tl_unchecked"}
        async with httpx.AsyncClient(
            transport=transport, base_url="http://t", headers=headers
        ) as client:
            yield client


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/sessions"),
        ("POST", "/v1/sessions"),
        ("GET", "/v1/sessions/00000000-0000-0000-0000-000000000000/entries"),
        ("GET", "/v1/runs/00000000-0000-0000-0000-000000000000/events"),
        ("GET", "/v1/memory/notes"),
        ("GET", "/readyz"),
    ],
)
async def test_while_the_database_is_down_requests_answer_503_with_retry_after(
    down: httpx.AsyncClient, method: str, path: str
) -> None:
    response = await down.request(method, path, json={} if method == "POST" else None)
    assert response.status_code == 503, response.text
    assert response.json()["error"]["code"] == "database_unavailable"
    assert int(response.headers["Retry-After"]) >= 1
    assert (await down.get("/healthz")).status_code == 200  # the process itself is fine


async def test_readyz_answers_within_its_own_timeout_when_connecting_hangs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A host that never answers would hold a connect for a minute; the probe says 503."""
    from app.api import health

    async def hanging(*_: object, **__: object) -> None:
        await asyncio.Event().wait()

    monkeypatch.setattr(health, "READY_TIMEOUT_SECONDS", 0.01)
    monkeypatch.setattr(asyncpg, "connect", hanging)
    app = create_app(Settings(database_url=f"postgresql://nobody@127.0.0.1:{free_port()}/none"))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            response = await client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "database_unavailable"
