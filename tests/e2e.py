"""Fixtures for end-to-end runs: a fake LLM upstream, a database of their own, a real
`threadline serve` (API + workers) in a thread, and a second API process."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from app.config import Settings
from app.db.engine import create_engine
from app.main import create_app
from app.services.key_cache import KeyCache
from app.services.keys import create_key, hash_key
from testkit.database import create_database as create_database  # the tests import it here
from testkit.server import free_port, serve_in_thread, stop_thread_server
from testkit.upstream import FakeUpstream

THREADLINE = os.path.join(os.path.dirname(sys.executable), "threadline")
# How much of a stopped process's output a failing test shows.
OUTPUT_TAIL_LINES = 80


@dataclass
class Service:
    url: str
    settings: Settings
    key_cache: KeyCache


async def heard(service: Service, key: str) -> None:
    """Returns once the service's key cache no longer holds `key`: a change to the key or its
    tenant's limits made out of its sight (not through its own admin API) was heard from the
    database. The next request with the key reads what the change wrote."""
    deadline = time.monotonic() + 60
    while service.key_cache.get(hash_key(key)) is not None:
        assert time.monotonic() < deadline, "the key cache never heard of the change"
        await asyncio.sleep(0.01)


@pytest.fixture(scope="session")
def upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream() as fake:
        yield fake


@pytest.fixture(scope="session")
def e2e_database(database_url: str) -> str:
    """A database of its own in the test cluster: runs queued by other tests (fuzzing) must
    never reach these workers and eat the fake upstream's scripts."""
    return create_database(database_url, "e2e")


def e2e_env(upstream: FakeUpstream) -> dict[str, Any]:
    """Settings for fast, scripted runs (as keyword arguments and as THREADLINE_* variables)."""
    return {
        "openai_api_key": "sk-test",
        "openai_base_url": upstream.openai_base_url,
        "anthropic_api_key": "sk-ant-test",
        "anthropic_base_url": upstream.url,
        "default_model": "openai:gpt-4o-mini",
        "llm_retry_base_seconds": 0.01,
        # Failure tests share the served router: its circuit breaker is tested on its own.
        "breaker_failures": 10_000,
        "tool_outputs_timeout_seconds": 3.0,
        "worker_heartbeat_seconds": 0.5,
        "stalled_after_seconds": 2.0,
        "stall_check_seconds": 0.5,
        "event_tick_seconds": 0.02,
        "sse_heartbeat_seconds": 1.0,
        "worker_shutdown_seconds": 1.0,
    }


@pytest.fixture(scope="session")
def e2e_settings(e2e_database: str, upstream: FakeUpstream) -> Settings:
    return Settings(database_url=e2e_database, db_pool_size=10, **e2e_env(upstream))


@pytest.fixture(scope="session")
def service(e2e_settings: Settings) -> Iterator[Service]:
    """`threadline serve` in a thread: the API and a pool of 4 workers."""
    app = create_app(e2e_settings, workers=4)
    server, thread, url = serve_in_thread(app)
    yield Service(url, e2e_settings, app.state.key_cache)
    stop_thread_server(server, thread)


@pytest.fixture
async def e2e_engine(e2e_settings: Settings) -> AsyncIterator[AsyncEngine]:
    engine = create_engine(e2e_settings)
    yield engine
    await engine.dispose()


@pytest.fixture
async def api(
    service: Service, e2e_engine: AsyncEngine, upstream: FakeUpstream
) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the served API as a fresh tenant; the upstream starts each test clean."""
    upstream.clear()
    key = await create_key(e2e_engine, f"e2e-{uuid.uuid4()}")
    async with httpx.AsyncClient(
        base_url=service.url, headers={"Authorization": f"Bearer {key}"}, timeout=30
    ) as client:
        yield client


def process_env(settings: Settings, **overrides: Any) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("THREADLINE_")}
    values = {
        "database_url": settings.database_url,
        # One process per `threadline serve`, as the tests count them (kill -9 of "the server",
        # its logs); serving with several is tested on its own (tests/test_serve.py).
        "processes": 1,
        **{
            k: getattr(settings, k)
            for k in (
                "openai_api_key",
                "openai_base_url",
                "anthropic_api_key",
                "anthropic_base_url",
                "default_model",
                "llm_retry_base_seconds",
                "worker_heartbeat_seconds",
                "stalled_after_seconds",
                "stall_check_seconds",
                "event_tick_seconds",
                "sse_heartbeat_seconds",
                "worker_shutdown_seconds",
            )
        },
        **overrides,
    }
    env.update({f"THREADLINE_{k.upper()}": str(v) for k, v in values.items() if v is not None})
    return env


class Process:
    """A `threadline` command in its own OS process (a second API, or a worker to kill)."""

    def __init__(self, args: list[str], env: dict[str, str], ready_url: str | None = None) -> None:
        self.args = args
        # Its output goes to a file that stop() prints the end of: pytest shows it when the
        # test fails, which is the only trace a CI failure of another process leaves.
        fd, name = tempfile.mkstemp(prefix=f"threadline-{args[0]}-", suffix=".log")
        self.log = Path(name)
        with os.fdopen(fd, "wb") as log:
            self.process = subprocess.Popen(
                [THREADLINE, *args], env=env, stdout=log, stderr=subprocess.STDOUT
            )
        if ready_url is not None:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    if httpx.get(ready_url, timeout=1).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                time.sleep(0.1)
            self.stop()
            raise RuntimeError(f"{args} never became ready")

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()
        if self.log.exists():
            lines = self.log.read_text(errors="replace").splitlines()[-OUTPUT_TAIL_LINES:]
            print(f"--- threadline {' '.join(self.args)}: the end of its output ---")
            print("\n".join(line[:500] for line in lines))
            self.log.unlink()


@pytest.fixture(scope="session")
def second_api(e2e_settings: Settings) -> Iterator[str]:
    """Another API process (no workers) on the same database."""
    port = free_port()
    env = process_env(e2e_settings, worker_concurrency=0, port=port)
    process = Process(["serve", "--port", str(port)], env, f"http://127.0.0.1:{port}/readyz")
    yield f"http://127.0.0.1:{port}"
    process.stop()
