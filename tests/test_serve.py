"""`threadline serve --processes N`: N processes, each the API and workers, on one port and one
database; asks are answered whichever process takes them; SIGTERM stops them all."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import uuid

import httpx
import psutil
import pytest

from app.config import Settings
from testkit.server import free_port
from testkit.sse_client import collect
from testkit.upstream import FakeUpstream, Text
from tests.conftest import issue_key
from tests.e2e import Process, create_database, e2e_env, process_env


@pytest.fixture
def two_processes(database_url: str, upstream: FakeUpstream) -> tuple[Process, str, str]:
    upstream.clear()
    settings = Settings(database_url=create_database(database_url, "serve2"), **e2e_env(upstream))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = process_env(settings, port=port, processes=2, worker_concurrency=4)
    served = Process(["serve", "--port", str(port)], env, f"{url}/readyz")
    return served, url, issue_key(settings, f"serve2-{uuid.uuid4()}")


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
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    served.stop()


def test_processes_default_to_the_cores_and_to_one_with_a_local_model() -> None:
    from app.cli import serve_processes

    cores = len(__import__("os").sched_getaffinity(0))
    assert serve_processes(Settings(_env_file=None, default_model="openai:gpt-4o-mini")) == cores
    assert serve_processes(Settings(_env_file=None, default_model="local:smollm2")) == 1
    assert serve_processes(Settings(_env_file=None, processes=3)) == 3
