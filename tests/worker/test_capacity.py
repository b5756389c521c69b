"""How many runs a process executes at once: what it can carry, and a waiting run holds no
database connection (so the pool does not bound it)."""

from __future__ import annotations

import asyncio
import threading
import uuid

import httpx
import pytest

from app.config import Settings
from app.main import create_app
from app.worker import capacity
from app.worker.capacity import FILES_PER_RUN, MAX_RUNS, MEMORY_PER_RUN, RESERVED_FILES
from testkit.server import serve_in_thread, stop_thread_server
from testkit.upstream import FakeUpstream, Hold, Text
from tests.conftest import issue_key
from tests.e2e import create_database, e2e_env


def test_the_capacity_follows_open_files_and_memory() -> None:
    plenty = 1 << 40
    assert capacity.runs_capacity(1 << 20, plenty) == MAX_RUNS
    assert capacity.runs_capacity(1024, plenty) == (1024 - RESERVED_FILES) // FILES_PER_RUN
    assert capacity.runs_capacity(1 << 20, 300 * MEMORY_PER_RUN) == 300
    assert capacity.runs_capacity(RESERVED_FILES, plenty) == 1  # never none
    assert capacity.runs_capacity(None, None) == capacity.FALLBACK_RUNS


def test_the_default_is_far_above_a_handful_on_this_machine() -> None:
    # The process may open as many files as its hard limit allows: a run holds sockets.
    assert capacity.default_concurrency() >= 100


@pytest.fixture
def small_pool(database_url: str, upstream: FakeUpstream) -> tuple[Settings, str]:
    """A database of its own, a pool of 4 connections (2, and as many overflow), and a key."""
    settings = Settings(
        database_url=create_database(database_url, "capacity"),
        **{**e2e_env(upstream), "db_pool_size": 2},
    )
    return settings, issue_key(settings, f"capacity-{uuid.uuid4()}")


async def test_runs_waiting_on_their_model_hold_no_database_connection(
    small_pool: tuple[Settings, str], upstream: FakeUpstream
) -> None:
    """12 runs wait on the upstream at once in a process whose pool has 4 connections (one of
    them its worker lease): had a waiting run kept one, at most 3 could have reached it."""
    runs = 12
    settings, key = small_pool
    upstream.clear()
    release = threading.Event()
    for _ in range(runs):
        upstream.script(Hold(release), Text("done"))
    server, thread, url = serve_in_thread(create_app(settings, workers=runs))
    headers = {"Authorization": f"Bearer {key}"}
    try:
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as api:
            run_ids = []
            for _ in range(runs):
                session = (await api.post("/v1/sessions", json={})).json()
                asked = await api.post(
                    f"/v1/sessions/{session['id']}/ask", json={"input": "hi", "stream": False}
                )
                assert asked.status_code == 202, asked.text
                run_ids.append(asked.json()["id"])
            for _ in range(600):  # at most a minute: a failure, not a measure of speed
                if len(upstream.requests) == runs:
                    break
                await asyncio.sleep(0.1)
            assert len(upstream.requests) == runs
            release.set()
            for run_id in run_ids:
                for _ in range(600):
                    run = (await api.get(f"/v1/runs/{run_id}")).json()
                    if run["status"] not in ("queued", "running"):
                        break
                    await asyncio.sleep(0.1)
                assert run["status"] == "completed", run
    finally:
        release.set()
        stop_thread_server(server, thread)
        upstream.clear()
