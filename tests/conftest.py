"""Shared fixtures: a real Postgres (throwaway cluster, or TEST_DATABASE_URL), the app, tenants."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import hypothesis
import pytest
from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncEngine

from app.config import DEFAULT_LOCAL_MODEL, Settings
from app.db.embedded import throwaway_cluster
from app.db.migrate import upgrade_to_head
from app.main import create_app
from app.services.keys import create_key
from testkit.database import create_database, drop_database
from testkit.server import serve_in_thread, stop_thread_server

pytest_plugins = ["tests.e2e"]

# The suite shares small machines with other work: an example that runs slowly there is load, not
# a bug, so no test has a deadline and the too_slow health check is off (the other health checks
# count examples and sizes, which load does not change). print_blob: a failure found at random
# prints the @reproduce_failure line that replays it. Loaded before any test module is imported,
# so a test's own @settings(max_examples=...) inherits the rest. HYPOTHESIS_PROFILE picks another:
# "thorough" (more examples for the tests that do not set their own), or Hypothesis's "ci".
hypothesis.settings.register_profile(
    "threadline",
    hypothesis.settings.get_profile("default"),  # not whatever Hypothesis loaded (CI: "ci")
    deadline=None,
    suppress_health_check=[hypothesis.HealthCheck.too_slow],
    print_blob=True,
)
hypothesis.settings.register_profile(
    "thorough", hypothesis.settings.get_profile("threadline"), max_examples=1000
)
hypothesis.settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "threadline"))


# Parallel runs (pytest-xdist, addopts "-n auto"): this many workers for a run of several files.
# The suite waits on subprocesses, servers and Postgres more than it computes, so one worker
# more than the machine's cores keeps them busy (on 2 cores, loaded by other work: 17:55 with 3
# workers, where the serial run took 21:42 on a quiet machine).
PARALLEL_WORKERS = 3


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: no worker processes for one file or test (spawning them costs more than it
    saves), PARALLEL_WORKERS (at most one a file) otherwise; -n N on the command line wins."""
    given = [str(arg).split("::")[0] for arg in config.args] or ["."]
    files = {arg for arg in given if arg.endswith(".py")}
    if len(files) < len(given):  # a directory: many files
        return PARALLEL_WORKERS
    return 0 if len(files) <= 1 else min(len(files), PARALLEL_WORKERS)


def worker_name(config: pytest.Config) -> str | None:
    """The xdist worker this process is ("gw0", "gw1"…), None outside a parallel run."""
    worker_input = getattr(config, "workerinput", None)
    return None if worker_input is None else str(worker_input["workerid"])


@pytest.fixture(scope="session")
def database_url(pytestconfig: pytest.Config) -> Iterator[str]:
    """TEST_DATABASE_URL if set, else a throwaway cluster that lives for the test session.

    In a parallel run each worker gets a cluster of its own, or on TEST_DATABASE_URL's server a
    database of its own (`<db>_gw0_<random>`, dropped at the end): tests that count rows or
    drain the job queue must not see another worker's."""
    configured = os.environ.get("TEST_DATABASE_URL")
    worker = worker_name(pytestconfig)
    if configured and worker is not None:
        database = configured.partition("?")[0].rsplit("/", 1)[1]
        url = create_database(configured, f"{database}_{worker}")
        yield url
        drop_database(configured, url)
        return
    if configured:
        upgrade_to_head(configured)
        yield configured
        return
    # Durability buys nothing in a throwaway cluster; speed does.
    fast = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}
    with throwaway_cluster("threadline-test-", {**fast, "max_connections": "300"}) as url:
        yield url


@pytest.fixture
def workdir() -> Iterator[Path]:
    """A fresh directory the postgres user can enter (pytest's tmp_path is 0700)."""
    path = Path(tempfile.mkdtemp(prefix="threadline-work-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def settings(database_url: str) -> Settings:
    """The in-process API's settings. It never calls a model, but sessions may only name
    configured providers: both have (unused) keys, and the default stays the local model."""
    return Settings(
        database_url=database_url,
        db_pool_size=20,
        openai_api_key="sk-unused",
        anthropic_api_key="sk-ant-unused",
        default_model=DEFAULT_LOCAL_MODEL,
    )


@pytest.fixture(scope="session")
async def app(settings: Settings) -> AsyncIterator[FastAPI]:
    application = create_app(settings)
    async with application.router.lifespan_context(application):
        yield application


@pytest.fixture(scope="session")
def engine(app: FastAPI) -> AsyncEngine:
    engine: AsyncEngine = app.state.engine
    return engine


ClientFactory = Callable[[str | None], httpx.AsyncClient]


@pytest.fixture
async def make_client(app: FastAPI) -> AsyncIterator[ClientFactory]:
    """Clients of the in-process app; pass an API key, or None for an anonymous one."""
    clients: list[httpx.AsyncClient] = []

    def make(key: str | None) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://test", headers=headers
        )
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.aclose()


@pytest.fixture
def new_key(engine: AsyncEngine) -> Callable[[], Awaitable[str]]:
    """A key of a brand-new tenant: tests never see each other's data."""

    async def issue() -> str:
        return await create_key(engine, f"tenant-{uuid.uuid4()}")

    return issue


@pytest.fixture
async def client(
    make_client: ClientFactory, new_key: Callable[[], Awaitable[str]]
) -> httpx.AsyncClient:
    """A client authenticated as a fresh tenant."""
    return make_client(await new_key())


@asynccontextmanager
async def api_with(
    settings: Settings, new_key: Callable[[], Awaitable[str]], **configured: object
) -> AsyncIterator[httpx.AsyncClient]:
    """A client (a new tenant's key) of an in-process API with its own `configured` settings."""
    application = create_app(
        Settings(database_url=settings.database_url, db_pool_size=2, **configured)  # type: ignore[arg-type]
    )
    async with (
        application.router.lifespan_context(application),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=application),
            base_url="http://test",
            headers={"Authorization": f"Bearer {await new_key()}"},
        ) as client,
    ):
        yield client


@dataclass
class LiveServer:
    url: str
    key: str


def issue_key(settings: Settings, tenant: str) -> str:
    """A key made from outside any running event loop (session fixtures)."""
    import asyncio

    from app.db.engine import create_engine

    async def issue() -> str:
        engine = create_engine(settings)
        try:
            return await create_key(engine, tenant)
        finally:
            await engine.dispose()

    return asyncio.run(issue())


@pytest.fixture(scope="session")
def live_server(settings: Settings) -> Iterator[LiveServer]:
    """The API alone (no workers) under a real uvicorn."""
    server, thread, url = serve_in_thread(create_app(settings))
    yield LiveServer(url, issue_key(settings, f"live-{uuid.uuid4()}"))
    stop_thread_server(server, thread)
