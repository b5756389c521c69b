"""Scale-out benchmark: two API processes and one worker process on one Postgres, directly and
through PgBouncer in transaction mode.

Prints figures only. Run with `python -m bench.scale_out [streams]` (default 100). Each mode
starts, on a throwaway cluster, `threadline migrate`, two `threadline serve --workers 0` and one
`threadline worker --concurrency <streams>`, each an OS process of its own; the fake OpenAI
upstream (a thread) and the load generator share this process. Then <streams> streaming asks
at once, alternating between the two API processes; every other stream hangs up after its
first delta and resumes on the other API process with Last-Event-ID. Each stream is checked:
ids 1..n without gap or repeat, one terminal event (run.completed), the whole answer, and the
journal holding the question and the answer. Printed: the streams each API process carried,
the time until all were done, per-stream times, connections to Postgres (peak, sampled), and
whether every stream completed with nothing lost or duplicated.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import httpx

from app.config import Settings
from app.db.embedded import throwaway_cluster
from app.db.engine import create_engine, libpq_url
from app.services.keys import create_key
from testkit.database import create_database
from testkit.pgbouncer import PgBouncer, find_pgbouncer
from testkit.server import free_port, wait_ready
from testkit.sse_client import TERMINAL, Event, events
from testkit.upstream import FakeUpstream, Script, Text

THREADLINE = os.path.join(os.path.dirname(sys.executable), "threadline")
MODEL = "openai:gpt-4o-mini"
TOKENS, TOKEN_DELAY = 100, 0.02  # 2 s of answer per stream
ANSWER = "".join(f"t{i} " for i in range(TOKENS))
POOL = 10  # THREADLINE_DB_POOL_SIZE of each process
STREAM_TIMEOUT = 120.0


@dataclass
class Outcome:
    """One ask's stream, as the client saw it across its connections."""

    events: list[Event] = field(default_factory=list)
    apis: list[int] = field(default_factory=list)  # the API process of each connection
    seconds: float = 0.0
    session_id: str = ""


@dataclass
class Deployment:
    urls: tuple[str, str]
    processes: list[subprocess.Popen[bytes]]
    logs: Path


def env_for(
    database_url: str, direct_url: str, pooled: bool, upstream: FakeUpstream
) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("THREADLINE_")}
    values: dict[str, object] = {
        "database_url": database_url,
        "direct_database_url": direct_url,
        "db_prepared_statements": not pooled,
        "db_pool_size": POOL,
        "openai_api_key": "sk-bench",
        "openai_base_url": upstream.openai_base_url,
        "default_model": MODEL,
        "log_level": "warning",
    }
    return env | {f"THREADLINE_{k.upper()}": str(v) for k, v in values.items()}


def start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen([THREADLINE, *args], env=env, stdout=out, stderr=out)


@contextmanager
def deployed(env: dict[str, str], streams: int) -> Iterator[Deployment]:
    logs = Path(tempfile.mkdtemp(prefix="threadline-bench-scale-"))
    migrate = subprocess.run([THREADLINE, "migrate"], env=env, capture_output=True, text=True)
    if migrate.returncode != 0:
        raise RuntimeError(f"threadline migrate failed:\n{migrate.stderr[-2000:]}")
    ports = free_port(), free_port()
    urls = (f"http://127.0.0.1:{ports[0]}", f"http://127.0.0.1:{ports[1]}")
    processes = [
        start(["serve", "--port", str(port), "--workers", "0"], env, logs / f"api-{i}.log")
        for i, port in enumerate(ports)
    ]
    processes.append(start(["worker", "--concurrency", str(streams)], env, logs / "worker.log"))
    try:
        for i, url in enumerate(urls):
            wait_ready(url, processes[i], logs / f"api-{i}.log")
        yield Deployment(urls, processes, logs)
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


async def one_stream(clients: tuple[httpx.AsyncClient, httpx.AsyncClient], index: int) -> Outcome:
    """Ask on API index % 2; every other stream hangs up after its first delta and resumes on
    the other API process."""
    outcome = Outcome()
    first = index % 2
    api = clients[first]
    started = time.perf_counter()
    session = (await api.post("/v1/sessions", json={})).json()
    outcome.session_id = session["id"]
    hang_up = index % 4 < 2
    body = {"input": f"question {index}", "stream": True}
    outcome.apis.append(first)
    async with api.stream("POST", f"/v1/sessions/{session['id']}/ask", json=body) as response:
        async for event in events(response):
            outcome.events.append(event)
            if event.type in TERMINAL or (hang_up and event.type == "message.delta"):
                break
    if outcome.events and outcome.events[-1].type not in TERMINAL:
        other = 1 - first
        run_id = outcome.events[0].data["run_id"]
        headers = {"Last-Event-ID": str(outcome.events[-1].id)}
        outcome.apis.append(other)
        url = f"/v1/runs/{run_id}/events"
        async with clients[other].stream("GET", url, headers=headers) as response:
            async for event in events(response):
                outcome.events.append(event)
    outcome.seconds = time.perf_counter() - started
    return outcome


def lost_or_duplicated(outcome: Outcome) -> bool:
    ids = [e.id for e in outcome.events]
    terminal = [e for e in outcome.events if e.type in TERMINAL]
    text = "".join(e.data["text"] for e in outcome.events if e.type == "message.delta")
    return (
        ids != list(range(1, len(ids) + 1))
        or len(terminal) != 1
        or terminal[0].type != "run.completed"
        or text != ANSWER
    )


async def journaled(client: httpx.AsyncClient, outcome: Outcome) -> bool:
    """The session's journal holds the question and the whole answer, once each."""
    page = await client.get(f"/v1/sessions/{outcome.session_id}/entries", params={"limit": 50})
    messages = [e["payload"] for e in page.json()["data"] if e["kind"] == "message"]
    return [m["role"] for m in messages] == ["user", "assistant"] and messages[1][
        "content"
    ] == ANSWER


async def sample_connections(direct_url: str, peak: list[int], stop: asyncio.Event) -> None:
    conn = await asyncpg.connect(libpq_url(direct_url))
    try:
        while not stop.is_set():
            count = await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            )
            peak[0] = max(peak[0], int(count) - 1)  # not this sampler's own
            await asyncio.sleep(0.1)
    finally:
        await conn.close()


async def drive(urls: tuple[str, str], key: str, direct_url: str, streams: int) -> None:
    headers = {"Authorization": f"Bearer {key}"}
    limits = httpx.Limits(max_connections=streams * 2, max_keepalive_connections=streams)
    peak, stop = [0], asyncio.Event()
    sampler = asyncio.create_task(sample_connections(direct_url, peak, stop))
    async with (
        httpx.AsyncClient(base_url=urls[0], headers=headers, timeout=60, limits=limits) as a,
        httpx.AsyncClient(base_url=urls[1], headers=headers, timeout=60, limits=limits) as b,
    ):
        started = time.perf_counter()
        async with asyncio.timeout(STREAM_TIMEOUT):
            outcomes = await asyncio.gather(*(one_stream((a, b), i) for i in range(streams)))
        elapsed = time.perf_counter() - started
        stop.set()
        await sampler
        journal_ok = sum(await asyncio.gather(*(journaled(a, o) for o in outcomes)))
    carried = [sum(api in o.apis for o in outcomes) for api in (0, 1)]
    resumed = [sum(len(o.apis) == 2 and o.apis[1] == api for o in outcomes) for api in (0, 1)]
    bad = sum(lost_or_duplicated(o) for o in outcomes)
    times = sorted(o.seconds for o in outcomes)
    print(f"  streams per API process: A {carried[0]} (of them resumed here: {resumed[0]}),")
    print(f"                           B {carried[1]} (of them resumed here: {resumed[1]})")
    print(f"  all {streams} done in {elapsed:.2f} s; per stream (session, ask, answer of")
    print(
        f"  {TOKENS} tokens at {1 / TOKEN_DELAY:.0f}/s): median {statistics.median(times):.2f} s,"
        f" max {times[-1]:.2f} s"
    )
    print(f"  connections to Postgres, peak sampled every 0.1 s: {peak[0]}")
    completed = streams - bad
    print(
        f"  completed with every event exactly once: {completed}/{streams};"
        f" journals with question and answer: {journal_ok}/{streams}"
        + ("  -> all complete, none lost" if completed == journal_ok == streams else "  -> LOST")
    )


def run_mode(cluster_url: str, upstream: FakeUpstream, streams: int, pooled: bool) -> None:
    direct = cluster_url
    name = "through PgBouncer (transaction mode)" if pooled else "direct"
    bouncer = PgBouncer(direct, server_connections=20) if pooled else None
    try:
        database_url = bouncer.url if bouncer else direct
        env = env_for(database_url, direct, pooled, upstream)

        async def issue() -> str:
            engine = create_engine(Settings(database_url=direct))
            try:
                return await create_key(engine, f"bench-{uuid.uuid4()}")
            finally:
                await engine.dispose()

        with deployed(env, streams) as deployment:
            key = asyncio.run(issue())
            print(
                f"{name}: 2 API processes (serve --workers 0), 1 worker (--concurrency"
                f" {streams}), THREADLINE_DB_POOL_SIZE={POOL}"
                + (", PgBouncer default_pool_size=20" if pooled else "")
            )
            asyncio.run(drive(deployment.urls, key, direct, streams))
    finally:
        if bouncer is not None:
            bouncer.stop()


def main() -> None:
    streams = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    script = Script(tuple(Text(f"t{i} ") for i in range(TOKENS)), TOKEN_DELAY)
    with (
        throwaway_cluster("threadline-bench-scale-", {"max_connections": "300"}) as url,
        FakeUpstream() as upstream,
    ):
        upstream.respond_with(lambda _request: script)
        print(f"scale-out: {streams} streaming asks at once, half resumed on the other process")
        run_mode(url, upstream, streams, pooled=False)
        if find_pgbouncer() is None:
            print("through PgBouncer: skipped (pgbouncer is not installed)")
        else:
            # A database of its own: the first mode's sessions and jobs stay out of it.
            run_mode(create_database(url, "scale", migrate=False), upstream, streams, pooled=True)


if __name__ == "__main__":
    main()
