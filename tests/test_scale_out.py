"""Several processes on one Postgres: two API processes (`threadline serve --workers 0`) and a
`threadline worker`, each a real OS process, directly and through PgBouncer in transaction
mode. A stream asked on one API process is followed and resumed on the other, event for event;
a worker killed mid-stream (kill -9) loses nothing, and the stream resumed on the other API
process ends with exactly one terminal event (DESIGN invariants 3, 7 and 8 across processes).
"""

from __future__ import annotations

import json
import subprocess
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from app.config import Settings
from app.db.engine import libpq_url
from testkit.api import history, new_session
from testkit.pgbouncer import PgBouncer, find_pgbouncer
from testkit.server import free_port, wait_ready
from testkit.sse_client import TERMINAL, Event, events, read_to_end
from testkit.upstream import DEFAULT_SCRIPT as OK
from testkit.upstream import FakeUpstream, Hold, Script, Text
from tests.conftest import issue_key
from tests.e2e import THREADLINE, create_database, e2e_env, process_env

pytestmark = pytest.mark.slow


class Command:
    """A `threadline` command in an OS process of its own, its output kept in a log file."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        with log.open("ab") as out:
            self.process = subprocess.Popen(
                [THREADLINE, *args], env=env, stdout=out, stderr=subprocess.STDOUT
            )

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def kill(self) -> None:
        """kill -9: no shutdown, no cleanup."""
        self.process.kill()
        self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()


@dataclass
class Deployment:
    """Two API processes and the worker processes of one database."""

    api_urls: tuple[str, str]
    key: str
    env: dict[str, str]
    logs: Path
    database_url: str
    workers: list[Command] = field(default_factory=list)
    commands: list[Command] = field(default_factory=list)

    def start_worker(self) -> Command:
        log = self.logs / f"worker-{len(self.workers)}.log"
        worker = Command(["worker", "--concurrency", "2"], self.env, log)
        self.workers.append(worker)
        self.commands.append(worker)
        return worker

    def client(self, index: int) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {self.key}"}
        return httpx.AsyncClient(base_url=self.api_urls[index], headers=headers, timeout=60)

    def outputs(self) -> str:
        return "\n".join(f"--- {c.log.name}\n{c.output()}" for c in self.commands)


@pytest.fixture(scope="module", params=["direct", "pgbouncer"])
def deployment(
    request: pytest.FixtureRequest,
    database_url: str,
    upstream: FakeUpstream,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Deployment]:
    """A fresh database, migrated by `threadline migrate`; two API processes without workers
    and one worker process. With "pgbouncer", every pooled connection goes through PgBouncer
    in transaction mode; LISTEN, the worker leases, the queue and migrations connect directly
    (THREADLINE_DIRECT_DATABASE_URL)."""
    direct = create_database(database_url, "scale", migrate=False)
    bouncer: PgBouncer | None = None
    overrides: dict[str, Any] = {"db_pool_size": 4, "direct_database_url": direct}
    if request.param == "pgbouncer":
        if find_pgbouncer() is None:
            pytest.skip("pgbouncer is not installed (`make test` installs it as root on Debian)")
        bouncer = PgBouncer(direct)
        overrides["db_prepared_statements"] = False
    pooled = bouncer.url if bouncer else direct
    env = process_env(Settings(database_url=pooled, **e2e_env(upstream)), **overrides)
    logs = tmp_path_factory.mktemp(f"scale-{request.param}")
    migrate = subprocess.run(
        [THREADLINE, "migrate"], env=env, capture_output=True, text=True, timeout=300
    )
    assert migrate.returncode == 0, migrate.stderr
    ports = free_port(), free_port()
    api_env = {**env, "THREADLINE_WORKER_CONCURRENCY": "7"}  # --workers 0 must win over it
    apis = [
        Command(["serve", "--port", str(port), "--workers", "0"], api_env, logs / f"api-{i}.log")
        for i, port in enumerate(ports)
    ]
    urls = (f"http://127.0.0.1:{ports[0]}", f"http://127.0.0.1:{ports[1]}")
    key = issue_key(Settings(database_url=direct), f"scale-{uuid.uuid4()}")
    served = Deployment(urls, key, env, logs, direct, commands=list(apis))
    try:
        for api, url in zip(apis, urls, strict=True):
            wait_ready(url, api.process, api.log)
        served.start_worker()
        yield served
    finally:
        for command in served.commands:
            command.stop()
        if bouncer is not None:
            bouncer.stop()


async def read_until(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    done: Any,
    *,
    after: int | None = None,
    on_open: Any = None,
    **kwargs: Any,
) -> list[Event]:
    """A stream's events until `done(events so far)` holds or the run ends, then hang up.
    `after`: resume with Last-Event-ID; `on_open`: called once the response has started."""
    headers = {"Last-Event-ID": str(after)} if after is not None else {}
    out: list[Event] = []
    async with client.stream(method, url, headers=headers, **kwargs) as response:
        assert response.status_code == 200, (await response.aread()).decode()
        if on_open is not None:
            on_open()
        async for event in events(response):
            out.append(event)
            if event.type in TERMINAL or done(out):
                break
    return out


def text_of(seen: list[Event]) -> str:
    return "".join(e.data["text"] for e in seen if e.type == "message.delta")


async def registered_workers(database_url: str) -> int:
    conn = await asyncpg.connect(libpq_url(database_url))
    try:
        return int(await conn.fetchval("SELECT count(*) FROM procrastinate_workers"))
    finally:
        await conn.close()


def messages_of(thread: list[dict[str, Any]]) -> list[tuple[str, str]]:
    messages = [e["payload"] for e in thread if e["kind"] == "message"]
    return [(m["role"], m["content"]) for m in messages]


def words(prefix: str, count: int) -> list[Text]:
    return [Text(f"{prefix}{i} ") for i in range(count)]


def expected(prefix: str, count: int) -> str:
    return "".join(f"{prefix}{i} " for i in range(count))


def assert_exactly_once(seen: list[Event]) -> None:
    """Ids 1..n with no gap nor repeat, and one terminal event, the last."""
    assert [e.id for e in seen] == list(range(1, len(seen) + 1)), [e.id for e in seen]
    assert [e.type in TERMINAL for e in seen].count(True) == 1, [e.type for e in seen]
    assert seen[-1].type in TERMINAL


async def test_a_stream_asked_on_one_api_process_resumes_on_the_other(
    deployment: Deployment, upstream: FakeUpstream
) -> None:
    upstream.clear()
    second_part, third_part = threading.Event(), threading.Event()
    upstream.script(
        *words("a", 10), Hold(second_part), *words("b", 10), Hold(third_part), *words("c", 10)
    )
    answer = expected("a", 10) + expected("b", 10) + expected("c", 10)
    try:
        async with deployment.client(0) as api_a, deployment.client(1) as api_b:
            sid = (await new_session(api_a))["id"]
            # Asked on A; hung up once the first part arrived (the upstream holds the rest).
            on_a = await read_until(
                api_a,
                "POST",
                f"/v1/sessions/{sid}/ask",
                lambda seen: text_of(seen).endswith("a9 "),
                json={"input": "count for me", "stream": True},
            )
            run_id = on_a[0].data["run_id"]
            events_url = f"/v1/runs/{run_id}/events"
            # Resumed on B after the last event A saw; hung up after the second part.
            on_b = await read_until(
                api_b,
                "GET",
                events_url,
                lambda seen: text_of(on_a + seen).endswith("b9 "),
                after=on_a[-1].id,
                on_open=second_part.set,
            )
            # Resumed on A after the last event B saw, to the end.
            rest = await read_until(
                api_a,
                "GET",
                events_url,
                lambda seen: False,
                after=on_b[-1].id,
                on_open=third_part.set,
            )
            seen = on_a + on_b + rest
            assert_exactly_once(seen)
            assert seen[-1].type == "run.completed", seen[-1]
            assert text_of(seen) == answer
            # Every event id means the same event on either process: a full replay on each
            # equals what the three partial streams delivered.
            for api in (api_a, api_b):
                replay = await read_to_end(api, "GET", events_url)
                assert replay.status == 200 and replay.events == seen
            run = (await api_b.get(f"/v1/runs/{run_id}")).json()
            assert run["status"] == "completed" and run["result"] == answer
            # `--workers 0` won over THREADLINE_WORKER_CONCURRENCY: only the worker process
            # took jobs.
            assert await registered_workers(deployment.database_url) == 1
            thread = await history(api_b, sid)
            assert messages_of(thread) == [("user", "count for me"), ("assistant", answer)]
    except BaseException:
        print(deployment.outputs())
        raise
    finally:
        second_part.set()
        third_part.set()


async def test_a_worker_killed_mid_stream_loses_nothing_across_api_processes(
    deployment: Deployment, upstream: FakeUpstream
) -> None:
    upstream.clear()
    never = threading.Event()  # the first attempt is held until its worker is dead
    upstream.script(*words("p", 10), Hold(never), *words("q", 10))
    # Which of the new worker's two runs calls the upstream first is not known: answer by
    # the question rather than in order.
    retried = Script((Text("the retried "), Text("answer")))
    upstream.respond_with(
        lambda request: retried if "tell me" in json.dumps(request.body["messages"]) else OK
    )
    try:
        async with deployment.client(0) as api_a, deployment.client(1) as api_b:
            sid = (await new_session(api_a))["id"]
            on_a = await read_until(
                api_a,
                "POST",
                f"/v1/sessions/{sid}/ask",
                lambda seen: text_of(seen).endswith("p9 "),
                json={"input": "tell me", "stream": True},
            )
            run_id = on_a[0].data["run_id"]
            # The model is mid-answer: the user's entry was committed before it was called,
            # and the other API process reads it already.
            assert messages_of(await history(api_b, sid)) == [("user", "tell me")]
            deployment.workers[-1].kill()
            # With no worker alive, an ask is still accepted, and kept until one comes.
            other_sid = (await new_session(api_b))["id"]
            queued = await api_b.post(
                f"/v1/sessions/{other_sid}/ask", json={"input": "and me?", "stream": False}
            )
            assert queued.status_code == 202, queued.text
            assert queued.json()["status"] == "queued"
            deployment.start_worker()
            # Resumed on B after the last event A saw: the server ends the stream after the
            # one terminal event (read_to_end returns only once the server closed it).
            resumed = await read_to_end(
                api_b,
                "GET",
                f"/v1/runs/{run_id}/events",
                headers={"Last-Event-ID": str(on_a[-1].id)},
            )
            assert resumed.status == 200
            seen = on_a + resumed.events
            assert_exactly_once(seen)
            assert seen[-1].type == "run.completed", seen[-1]
            types = [e.type for e in seen]
            # The partial answer is replaced, the documented way: message.reset, then the
            # retried attempt's text.
            reset = types.index("message.reset")
            assert text_of(seen[:reset]) == expected("p", 10)
            assert seen[reset].data == {"reason": "retry", "attempt": 2}
            assert text_of(seen[reset:]) == "the retried answer"
            assert types.count("run.started") == 2
            replay = await read_to_end(api_a, "GET", f"/v1/runs/{run_id}/events")
            assert replay.events == seen
            run = (await api_a.get(f"/v1/runs/{run_id}")).json()
            assert run["status"] == "completed" and run["attempts"] == 2
            assert run["result"] == "the retried answer"
            thread = await history(api_a, sid)
            assert Counter(e["kind"] for e in thread) == {
                "message": 2,
                "run_start": 1,
                "usage": 1,
                "run_end": 1,
            }
            assert messages_of(thread) == [
                ("user", "tell me"),
                ("assistant", "the retried answer"),
            ]
            # The ask accepted while no worker lived was answered by the new one.
            waited = await api_a.get(
                f"/v1/runs/{queued.json()['id']}", params={"wait": "true", "timeout": 60}
            )
            assert waited.json()["status"] == "completed", waited.text
            assert waited.json()["result"] == "ok"
    except BaseException:
        print(deployment.outputs())
        raise
    finally:
        never.set()
