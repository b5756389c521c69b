"""`threadline serve --processes N`: N processes, each the API and workers, on one port and one
database; asks are answered whichever process takes them; SIGTERM stops them all."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import threading
import uuid

import asyncpg
import httpx
import psutil
import pytest

from app.config import Settings
from app.db.engine import libpq_url
from testkit.server import free_port
from testkit.sse_client import collect
from testkit.upstream import FakeUpstream, Hold, Text
from tests.conftest import issue_key
from tests.e2e import Process, create_database, e2e_env, process_env


def serve_two(
    database_url: str, upstream: FakeUpstream, worker_concurrency: int
) -> tuple[Process, str, str]:
    upstream.clear()
    settings = Settings(database_url=database_url, **e2e_env(upstream))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = process_env(settings, port=port, processes=2, worker_concurrency=worker_concurrency)
    served = Process(["serve", "--port", str(port)], env, f"{url}/readyz")
    return served, url, issue_key(settings, f"serve2-{uuid.uuid4()}")


@pytest.fixture
def two_processes(database_url: str, upstream: FakeUpstream) -> tuple[Process, str, str]:
    return serve_two(create_database(database_url, "serve2"), upstream, worker_concurrency=4)


async def test_two_processes_share_the_port_answer_asks_and_stop_together(
    two_processes: tuple[Process, str, str], upstream: FakeUpstream
) -> None:
    served, url, key = two_processes
    try:
        supervisor = psutil.Process(served.process.pid)
        children = supervisor.children(recursive=True)

        async with httpx.AsyncClient(
            base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60
        ) as api:
            # Both processes answer on the one port (new connections go to either).
            answered: set[int] = set()
            for _ in range(500):
                async with httpx.AsyncClient(base_url=url, timeout=60) as fresh:
                    answered.add((await fresh.get("/healthz")).json()["process"])
                if len(answered) == 2:
                    break
            assert len(answered) == 2 and answered <= {c.pid for c in children}

            for n in range(6):
                upstream.script(Text(f"answer {n}"))
            sessions = [(await api.post("/v1/sessions", json={})).json()["id"] for _ in range(6)]
            streams = await asyncio.gather(
                *(
                    collect(api, "POST", f"/v1/sessions/{sid}/ask", json={"input": "hi"})
                    for sid in sessions
                )
            )
            assert all(events[-1].type == "run.completed" for events in streams)
            assert sorted(events[-1].data["text"] for events in streams) == [
                f"answer {n}" for n in range(6)
            ]

            # A process killed outright is started again; the port keeps answering.
            psutil.Process(min(answered)).kill()
            replaced: set[int] = set()
            for _ in range(2_000):
                try:
                    async with httpx.AsyncClient(base_url=url, timeout=60) as fresh:
                        replaced.add((await fresh.get("/healthz")).json()["process"])
                except httpx.TransportError:
                    pass
                if replaced - answered:
                    break
                await asyncio.sleep(0.05)
            assert replaced - answered, "no process took the killed one's place"
            children = supervisor.children(recursive=True)
    finally:
        served.process.send_signal(signal.SIGTERM)
        try:
            served.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            served.kill()
    assert served.process.returncode is not None
    # A process still finishing its exit as the supervisor ends is no orphan (one such was seen
    # on a loaded machine); one still running half a minute later is.
    _, left = psutil.wait_procs(children, timeout=30)
    running = [c for c in left if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    assert not running, [(c.pid, c.ppid(), c.cmdline()) for c in running]
    served.stop()


@pytest.fixture
def busy_process_pair(database_url: str, upstream: FakeUpstream) -> tuple[Process, str, str, str]:
    """Two processes whose workers each take one queued run at a time."""
    database = create_database(database_url, "serve2x")
    return (*serve_two(database, upstream, worker_concurrency=1), database)


async def session_lease(database: str, session_id: str) -> int | None:
    """The lease the session's one run ran under: each process's workers hold one of their own."""
    conn = await asyncpg.connect(libpq_url(database))
    try:
        lease: int | None = await conn.fetchval(
            "SELECT lease FROM runs WHERE session_id = $1::uuid", session_id
        )
        return lease
    finally:
        await conn.close()


async def test_an_ask_run_by_the_other_processs_worker_streams_to_its_client(
    busy_process_pair: tuple[Process, str, str, str], upstream: FakeUpstream
) -> None:
    served, url, key, database = busy_process_pair
    release = threading.Event()
    try:
        headers = {"Authorization": f"Bearer {key}"}
        one_connection = httpx.Limits(max_connections=1)
        first = httpx.AsyncClient(base_url=url, headers=headers, timeout=60, limits=one_connection)
        second = httpx.AsyncClient(base_url=url, headers=headers, timeout=60, limits=one_connection)
        async with first, second:
            # Each client keeps its one connection: both reach the same process.
            asking = (await first.get("/healthz")).json()["process"]
            for _ in range(500):
                if (await second.get("/healthz")).json()["process"] == asking:
                    break
                await second.aclose()
                second = httpx.AsyncClient(
                    base_url=url, headers=headers, timeout=60, limits=one_connection
                )
            assert (await second.get("/healthz")).json()["process"] == asking

            # The first ask's run is handed to the asking process's own worker and held
            # there: later asks to that process find no room and are queued, where either
            # process's worker may take them. Ask until the other process's took one.
            upstream.script(Hold(release), Text("held answer"))
            held_session = (await first.post("/v1/sessions", json={})).json()["id"]
            held = asyncio.create_task(
                collect(first, "POST", f"/v1/sessions/{held_session}/ask", json={"input": "one"})
            )
            await upstream.requests_arrived(1)
            asking_lease = await session_lease(database, held_session)
            assert asking_lease is not None
            leases: list[int | None] = []
            for n in range(40):
                upstream.script(Text(f"answer {n}"))
                sid = (await second.post("/v1/sessions", json={})).json()["id"]
                moved = await collect(
                    second, "POST", f"/v1/sessions/{sid}/ask", json={"input": "two"}
                )
                assert moved[-1].type == "run.completed"
                assert moved[-1].data["text"] == f"answer {n}"
                leases.append(await session_lease(database, sid))
                if leases[-1] != asking_lease:
                    break
            release.set()
            kept = await held
    finally:
        release.set()
        served.stop()
    assert kept[-1].type == "run.completed" and kept[-1].data["text"] == "held answer"
    assert None not in leases and leases[-1] != asking_lease, "the other process never took one"


def test_processes_default_to_the_cores_and_to_one_with_a_local_model() -> None:
    from app.cli import serve_processes

    cores = len(__import__("os").sched_getaffinity(0))
    assert serve_processes(Settings(_env_file=None, default_model="openai:gpt-4o-mini")) == cores
    assert serve_processes(Settings(_env_file=None, default_model="local:smollm2")) == 1
    assert serve_processes(Settings(_env_file=None, processes=3)) == 3
