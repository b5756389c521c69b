"""Recovery benchmark: how long after a worker is killed (SIGKILL) its run is running again on
another worker.

Prints figures only. Run with `python -m bench.recovery [kills]` (default 20). The API runs in
a thread of this process; the workers are `threadline worker` processes on a throwaway
cluster, with the default settings: heartbeats would only take a run over after 30 s, so what
is measured is the lease (Postgres releases a dead worker's advisory lock at once) and the
recovery loop. Each trial: one worker streams a run, a second one starts, the first is
killed; the figure is kill → the client receives the retried attempt's `run.started`.
"""

from __future__ import annotations

import asyncio
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid

import asyncpg
import httpx

from app.config import Settings
from app.db.embedded import throwaway_cluster
from app.db.engine import create_engine, libpq_url
from app.main import create_app
from app.services.keys import create_key
from testkit.server import serve_in_thread, stop_thread_server
from testkit.sse_client import events
from testkit.upstream import FakeUpstream, Text

THREADLINE = os.path.join(os.path.dirname(sys.executable), "threadline")
TOKENS, TOKEN_DELAY = 2000, 0.02  # a stream far longer than a trial


def worker(env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [THREADLINE, "worker", "--concurrency", "4"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def newest_worker(database_url: str) -> int:
    conn = await asyncpg.connect(libpq_url(database_url))
    try:
        return int(await conn.fetchval("SELECT coalesce(max(id), 0) FROM procrastinate_workers"))
    finally:
        await conn.close()


async def registered_after(database_url: str, worker_id: int) -> None:
    """Until a worker registered after `worker_id` (a new process is up and fetching)."""
    for _ in range(2400):
        if await newest_worker(database_url) > worker_id:
            return
        await asyncio.sleep(0.05)
    raise RuntimeError("no new worker registered within 2 minutes")


async def trial(
    api: httpx.AsyncClient,
    database_url: str,
    env: dict[str, str],
    running: subprocess.Popen[bytes],
) -> tuple[float, subprocess.Popen[bytes]]:
    """One kill; returns the recovery time (s) and the worker left running."""
    sid = (await api.post("/v1/sessions", json={})).json()["id"]
    body = {"input": "q", "stream": False}
    run = (await api.post(f"/v1/sessions/{sid}/ask", json=body)).json()
    before = await newest_worker(database_url)
    standby = worker(env)
    killed_at, recovered = 0.0, 0.0
    async with api.stream("GET", f"/v1/runs/{run['id']}/events") as response:
        async for event in events(response):
            if event.type == "message.delta" and not killed_at:
                await registered_after(database_url, before)  # only the recovery is timed
                running.send_signal(signal.SIGKILL)
                killed_at = time.perf_counter()
                await asyncio.to_thread(running.wait)
            elif event.type == "run.started" and killed_at:
                recovered = time.perf_counter() - killed_at
                break
    await api.post(f"/v1/runs/{run['id']}/cancel")
    return recovered, standby


async def run(database_url: str, upstream: FakeUpstream, kills: int) -> None:
    settings = Settings(
        database_url=database_url,
        openai_api_key="sk-bench",
        openai_base_url=upstream.openai_base_url,
        default_model="openai:gpt-4o-mini",
        log_level="warning",
    )
    engine = create_engine(settings)
    key = await create_key(engine, f"bench-{uuid.uuid4()}")
    await engine.dispose()
    env = {k: v for k, v in os.environ.items() if not k.startswith("THREADLINE_")}
    env |= {
        "THREADLINE_DATABASE_URL": database_url,
        "THREADLINE_OPENAI_API_KEY": "sk-bench",
        "THREADLINE_OPENAI_BASE_URL": upstream.openai_base_url,
        "THREADLINE_DEFAULT_MODEL": "openai:gpt-4o-mini",
        "THREADLINE_LOG_LEVEL": "warning",
    }
    for _ in range(2 * kills + 2):
        upstream.script(*[Text("t ") for _ in range(TOKENS)], token_delay=TOKEN_DELAY)
    server, thread, url = serve_in_thread(create_app(settings))
    headers = {"Authorization": f"Bearer {key}"}
    running = worker(env)
    times: list[float] = []
    try:
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120) as api:
            await registered_after(database_url, 0)
            for _ in range(kills):
                recovered, running = await trial(api, database_url, env, running)
                times.append(recovered)
    finally:
        running.send_signal(signal.SIGTERM)
        running.wait()
        stop_thread_server(server, thread)
    cuts = statistics.quantiles(times, n=20)
    print(f"defaults: stalled_after_seconds={settings.stalled_after_seconds} (heartbeats),")
    print(f"  recovery_check_seconds={settings.recovery_check_seconds} (leases)")
    print(
        f"recovery after kill -9, {len(times)} kills: p50 {statistics.median(times):.2f} s,"
        f" p95 {cuts[18]:.2f} s, max {max(times):.2f} s"
    )


def main() -> None:
    kills = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    with (
        throwaway_cluster("threadline-bench-recovery-") as database_url,
        FakeUpstream() as upstream,
    ):
        asyncio.run(run(database_url, upstream, kills))


if __name__ == "__main__":
    main()
