"""What metrics cost: N asks (20 at a time) against `threadline serve` with metrics on and
off, each on a fresh database of one throwaway cluster, the fake OpenAI upstream answering.

Prints runs/s and the p50/p99 time from POST /ask to the first `message.delta` at the client,
for each setting, alternating (off, on, off, on) so that a machine busy with other work
weighs on both alike, and the ratios of their medians. Run with `python -m bench.telemetry
[N]` (default 200).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import httpx

from app.db.embedded import throwaway_cluster
from app.db.engine import create_engine
from app.services.keys import create_key
from bench.streams import THREADLINE, stop
from testkit.database import create_database
from testkit.metrics import scrape
from testkit.server import free_port, wait_ready
from testkit.sse_client import TERMINAL, events
from testkit.upstream import FakeUpstream

ASKS = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 200
AT_ONCE = 20
ROUNDS = ("off", "on", "off", "on")


@contextmanager
def served(database_url: str, upstream: FakeUpstream, metrics: bool) -> Iterator[str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("THREADLINE_")}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    values = {
        "database_url": database_url,
        "openai_api_key": "sk-bench",
        "openai_base_url": upstream.openai_base_url,
        "default_model": "openai:gpt-4o-mini",
        "metrics_enabled": str(metrics).lower(),
        "log_format": "json",
        "log_level": "info",  # a JSON access line per request, in both settings
        "port": str(port),
    }
    env.update({f"THREADLINE_{k.upper()}": v for k, v in values.items()})
    process = subprocess.Popen(
        [THREADLINE, "serve"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, process)
        yield url
    finally:
        stop(process)


async def first_token_seconds(client: httpx.AsyncClient, gate: asyncio.Semaphore) -> float:
    async with gate:
        session = (await client.post("/v1/sessions", json={})).json()["id"]
        started = time.perf_counter()
        first: float | None = None
        body = {"input": "hello", "stream": True}
        async with client.stream("POST", f"/v1/sessions/{session}/ask", json=body) as response:
            response.raise_for_status()
            async for event in events(response):
                if event.type == "message.delta" and first is None:
                    first = time.perf_counter() - started
                if event.type in TERMINAL:
                    assert event.type == "run.completed", event
                    break
        assert first is not None, "no delta"
        return first


async def load(url: str, key: str) -> tuple[float, list[float]]:
    """(runs/s, first-token seconds of each ask) for ASKS asks, AT_ONCE at a time."""
    gate = asyncio.Semaphore(AT_ONCE)
    async with httpx.AsyncClient(
        base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=120
    ) as client:
        await asyncio.gather(*(first_token_seconds(client, gate) for _ in range(AT_ONCE)))
        started = time.perf_counter()
        firsts = await asyncio.gather(*(first_token_seconds(client, gate) for _ in range(ASKS)))
        return ASKS / (time.perf_counter() - started), list(firsts)


async def new_key(database_url: str) -> str:
    from app.config import Settings

    engine = create_engine(Settings(database_url=database_url))
    try:
        return await create_key(engine, "bench")
    finally:
        await engine.dispose()


def p(samples: Sequence[float], q: int) -> float:
    return statistics.quantiles(samples, n=100, method="inclusive")[q - 1] * 1000


def main() -> None:
    figures: dict[str, list[tuple[float, float, float]]] = {"on": [], "off": []}
    print(f"{ASKS} asks, {AT_ONCE} at a time, per round (after {AT_ONCE} warm-up asks)")
    with throwaway_cluster("threadline-bench-telemetry-") as cluster, FakeUpstream() as upstream:
        for setting in ROUNDS:
            database = create_database(cluster, "telemetry")
            key = asyncio.run(new_key(database))
            with served(database, upstream, setting == "on") as url:
                rate, firsts = asyncio.run(load(url, key))
                if setting == "on":
                    runs = scrape(url).get(
                        "threadline_runs_total", {"kind": "ask", "status": "completed"}
                    )
                    assert runs >= ASKS, runs  # the metrics did count
            figures[setting].append((rate, p(firsts, 50), p(firsts, 99)))
            print(
                f"metrics {setting:>3}: {rate:6.1f} runs/s, first token p50 "
                f"{p(firsts, 50):6.1f} ms, p99 {p(firsts, 99):6.1f} ms"
            )
    on, off = (
        [statistics.median(col) for col in zip(*figures[s], strict=True)] for s in ("on", "off")
    )
    print(
        f"medians: on {on[0]:.1f} runs/s, p99 {on[2]:.1f} ms; off {off[0]:.1f} runs/s, "
        f"p99 {off[2]:.1f} ms; on/off: runs/s x{on[0] / off[0]:.3f}, p99 x{on[2] / off[2]:.3f}"
    )


if __name__ == "__main__":
    main()
