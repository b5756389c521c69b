"""A database outage is a 503 the client can retry, and the service recovers without a restart.

A real `threadline serve` (API and workers) on a private cluster, which the test stops as a crash
would (`pg_ctl -m immediate`) and starts again. While it is down, requests answer 503
`database_unavailable` with `Retry-After`, and /readyz 503; an SSE stream opened before the
outage stays open on heartbeats. Once it is back, requests succeed again, the stream delivers
the rest of its run (every event exactly once, as a replay has them), and an ask completes.
No assertion measures time: every wait polls with a generous deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.config import Settings
from app.db.embedded import EmbeddedPostgres
from app.db.migrate import upgrade_to_head
from testkit.api import new_session
from testkit.server import free_port, stop_process
from testkit.sse_client import TERMINAL, Event, read_to_end
from testkit.upstream import FakeUpstream, Hold, Text
from tests.conftest import issue_key
from tests.e2e import THREADLINE, e2e_env, process_env

DEADLINE_SECONDS = 120  # for each wait; never an assertion on how long anything took


@dataclass
class Served:
    """`threadline serve` on the private cluster, its log kept for failures."""

    url: str
    key: str
    process: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-6000:]


@pytest.fixture
def cluster() -> Iterator[EmbeddedPostgres]:
    """A cluster of this test's own: stopping it stops nobody else's database."""
    root = Path(tempfile.mkdtemp(prefix="threadline-test-outage-"))
    root.chmod(0o755)
    postgres = EmbeddedPostgres(root / "data", server_settings={"fsync": "off"})
    try:
        upgrade_to_head(postgres.start())
        yield postgres
    finally:
        postgres.stop(mode="immediate")
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def served(cluster: EmbeddedPostgres, upstream: FakeUpstream) -> Iterator[Served]:
    upstream.clear()
    settings = Settings(database_url=cluster.url, db_pool_size=5, **e2e_env(upstream))
    port = free_port()
    log = cluster.data_dir.parent / "serve.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [THREADLINE, "serve", "--port", str(port)],
            env=process_env(settings, port=port, worker_concurrency=2),
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    service = Served(f"http://127.0.0.1:{port}", issue_key(settings, "outage"), process, log)
    try:
        wait_until(lambda: _status(f"{service.url}/readyz") == 200, service, "ready")
        yield service
    finally:
        stop_process(process)
        upstream.clear()


def _status(url: str) -> int | None:
    try:
        return httpx.get(url, timeout=10).status_code
    except httpx.TransportError:
        return None


def wait_until(check: Callable[[], bool], service: Served, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_SECONDS
    while time.monotonic() < deadline:
        assert service.process.poll() is None, f"serve exited\n{service.output()}"
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"never {what}\n{service.output()}")


async def poll(check: Callable[[], Awaitable[bool]], service: Served, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_SECONDS
    while time.monotonic() < deadline:
        assert service.process.poll() is None, f"serve exited\n{service.output()}"
        if await check():
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"never {what}\n{service.output()}")


@dataclass
class Stream:
    """An SSE response read in the background: its events, and its heartbeats as they come."""

    events: list[Event] = field(default_factory=list)
    heartbeats: int = 0
    ended: bool = False


async def follow(response: httpx.Response, into: Stream) -> None:
    fields: dict[str, str] = {}
    async for line in response.aiter_lines():
        if line.startswith(":"):
            into.heartbeats += 1
        elif line == "":
            if fields:
                event = Event(int(fields["id"]), fields["event"], json.loads(fields["data"]))
                into.events.append(event)
            fields = {}
        else:
            name, _, value = line.partition(":")
            fields[name] = value[1:] if value.startswith(" ") else value
    into.ended = True


def unavailable(response: httpx.Response) -> bool:
    """A 503 a client knows to retry: database_unavailable, with Retry-After."""
    if response.status_code != 503:
        return False
    assert response.json()["error"]["code"] == "database_unavailable", response.text
    assert int(response.headers["Retry-After"]) >= 1, response.headers
    return True


@pytest.mark.slow
async def test_an_outage_answers_503_and_the_service_recovers_without_a_restart(
    served: Served, cluster: EmbeddedPostgres, upstream: FakeUpstream
) -> None:
    headers = {"Authorization": f"Bearer {served.key}"}
    async with httpx.AsyncClient(base_url=served.url, headers=headers, timeout=60) as api:
        sid = (await new_session(api))["id"]
        release = threading.Event()
        upstream.script(Text("before"), Hold(release), Text(" after"))
        stream = Stream()
        async with contextlib.AsyncExitStack() as stack:
            stack.callback(release.set)  # a test that failed midway leaves no request held
            response = await stack.enter_async_context(
                api.stream("POST", f"/v1/sessions/{sid}/ask", json={"input": "go"})
            )
            assert response.status_code == 200
            reader = asyncio.create_task(follow(response, stream))
            stack.push_async_callback(_cancel, reader)
            await poll(
                _sync(lambda: any(e.type == "message.delta" for e in stream.events)),
                served,
                "streamed its first delta",
            )
            run_id = stream.events[0].data["run_id"]

            await asyncio.to_thread(cluster.stop, "immediate")
            # Every request that needs the database: 503, a code to act on, when to retry.
            for method, url, body in (
                ("GET", f"/v1/sessions/{sid}", None),
                ("GET", f"/v1/sessions/{sid}/entries", None),
                ("POST", "/v1/sessions", {}),
                ("POST", f"/v1/sessions/{sid}/ask", {"input": "now?", "stream": False}),
                ("GET", f"/v1/runs/{run_id}", None),
                ("GET", f"/v1/runs/{run_id}/events", None),
            ):

                async def refused(method: str = method, url: str = url, body: Any = body) -> bool:
                    return unavailable(await api.request(method, url, json=body))

                await poll(refused, served, f"answered 503 to {method} {url}")
            await poll(ready_is(api, 503), served, "said it is not ready")
            # The stream opened before the outage is still open, kept alive by heartbeats.
            beats = stream.heartbeats
            await poll(_sync(lambda: stream.heartbeats >= beats + 2), served, "kept beating")
            assert not stream.ended and not reader.done()

            await asyncio.to_thread(cluster.start)
            await poll(ready_is(api, 200), served, "said it is ready again")

            async def answers() -> bool:
                return (await api.get(f"/v1/sessions/{sid}")).status_code == 200

            await poll(answers, served, "answered again")
            release.set()
            await asyncio.wait_for(reader, DEADLINE_SECONDS)

        # The stream delivered its run exactly as a replay has it: nothing lost, nothing twice,
        # through the terminal event (written after the outage: the model was held until then).
        # How the run ended is the worker's business; that the stream has it all is the API's.
        assert stream.events[-1].type in TERMINAL, stream.events
        replay = await read_to_end(api, "GET", f"/v1/runs/{run_id}/events")
        assert replay.events == stream.events
        assert [e.id for e in stream.events] == list(range(1, len(stream.events) + 1))

        upstream.script(Text("back"))
        again = await read_to_end(api, "POST", f"/v1/sessions/{sid}/ask", json={"input": "hi"})
        assert again.status == 200 and again.events[-1].type == "run.completed", again
        assert again.events[-1].data["text"] == "back"


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(BaseException):
        await task


def ready_is(api: httpx.AsyncClient, status: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        try:
            return (await api.get("/readyz")).status_code == status
        except httpx.TransportError:
            return False

    return check


def _sync(check: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    async def run() -> bool:
        return check()

    return run
