"""Worker processes of their own, on a database of their own, that tests kill, pause or
starve: the API alone is served in a thread."""

from __future__ import annotations

import signal
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from app.config import Settings
from app.main import create_app
from testkit.server import serve_in_thread, stop_thread_server
from testkit.upstream import FakeUpstream
from tests.conftest import issue_key
from tests.e2e import Process, create_database, e2e_env, process_env


@pytest.fixture
def crash_settings(database_url: str, upstream: FakeUpstream) -> Settings:
    """A database of its own: the served workers of other tests must not take this run."""
    return Settings(database_url=create_database(database_url, "crash"), **e2e_env(upstream))


@pytest.fixture
def crash_api(crash_settings: Settings, upstream: FakeUpstream) -> Iterator[tuple[str, str]]:
    """The API alone (only the test's worker processes execute runs): its URL and a key."""
    upstream.clear()
    server, thread, url = serve_in_thread(create_app(crash_settings))
    yield url, issue_key(crash_settings, f"crash-{uuid.uuid4()}")
    stop_thread_server(server, thread)


@pytest.fixture
async def api_only(crash_api: tuple[str, str]) -> AsyncIterator[httpx.AsyncClient]:
    url, key = crash_api
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as client:
        yield client


class Workers:
    """`threadline worker` processes on the crash database; the newest one can be killed."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.processes = [self._start()]

    def start(self) -> Process:
        self.processes.append(self._start())
        return self.processes[-1]

    def pause(self, process: Process) -> None:
        process.process.send_signal(signal.SIGSTOP)

    def resume(self, process: Process) -> None:
        process.process.send_signal(signal.SIGCONT)

    def _start(self) -> Process:
        return Process(["worker", "--concurrency", "2"], self.env)

    def kill_and_replace(self) -> None:
        """SIGKILL: no shutdown, no cleanup, its job stays "doing"; then a fresh worker."""
        self.processes[-1].kill()
        self.processes.append(self._start())

    def stop(self) -> None:
        for process in self.processes:
            self.resume(process)
            process.stop()


@pytest.fixture
def worker_settings() -> dict[str, Any]:
    """Settings of the test's worker processes, beyond e2e_env (a test may override it)."""
    return {}


@pytest.fixture
def workers(crash_settings: Settings, worker_settings: dict[str, Any]) -> Iterator[Workers]:
    pool = Workers(process_env(crash_settings, **worker_settings))
    yield pool
    pool.stop()
