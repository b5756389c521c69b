"""Queued runs benchmark: how soon a session's next queued run starts after the one before it.

Prints figures only. Run with `python -m bench.queue [asks]` (`make bench`; default 100,
BENCH_QUICK=1: 20). `threadline serve` at its default settings (as bench/streams.py starts it)
on a throwaway embedded cluster; <asks> asks sent at once to ONE session with
`multitask_strategy: enqueue` against the instant fake upstream. Each run is ordinary and short,
so what is measured is the queue: the gap between a run's end and the next run's start (from
the runs' own timestamps, in Postgres's clock), its p50 and p99, and the time until all were
done. Every run must complete, one after the other, never overlapping.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import sys
import time
from datetime import datetime

import httpx

from app.db.embedded import throwaway_cluster
from bench.journal import report
from bench.streams import TimedUpstream, percentile, run_loop, served, tenant_key

QUICK = os.environ.get("BENCH_QUICK") == "1" or "--quick" in sys.argv
ASKS = int(next((a for a in sys.argv[1:] if a.isdigit()), 20 if QUICK else 100))


async def run(database_url: str, upstream: TimedUpstream) -> None:
    key = await tenant_key(database_url)
    with served(database_url, upstream) as server:
        headers = {"Authorization": f"Bearer {key}"}
        limits = httpx.Limits(max_connections=ASKS + 10)
        async with httpx.AsyncClient(
            base_url=server.url, headers=headers, timeout=600, limits=limits
        ) as client:
            sid = (await client.post("/v1/sessions", json={})).json()["id"]
            started = time.monotonic()
            body = {"stream": False, "multitask_strategy": "enqueue"}
            answers = await asyncio.gather(
                *(
                    client.post(f"/v1/sessions/{sid}/ask", json={**body, "input": f"ask {n}"})
                    for n in range(ASKS)
                )
            )
            accepted = time.monotonic() - started
            refused = [a.text for a in answers if a.status_code != 202]
            run_ids = [a.json()["id"] for a in answers if a.status_code == 202]
            runs = [
                (await client.get(f"/v1/runs/{r}", params={"wait": "true", "timeout": 600})).json()
                for r in run_ids
            ]
            done = time.monotonic() - started
    report("queue", "asks", f"{ASKS} at once to one session (enqueue), {len(refused)} refused")
    report("queue", "accepted", f"{accepted:.2f} s for all")
    completed = [r for r in runs if r["status"] == "completed"]
    report("queue", "completed", f"{len(completed)}/{len(runs)} in {done:.1f} s")
    ordered = sorted(runs, key=lambda r: r["started_at"] or "")
    gaps_ms, overlaps = [], 0
    for before, after in itertools.pairwise(ordered):
        if not (before["ended_at"] and after["started_at"]):
            continue
        gap = _seconds(after["started_at"]) - _seconds(before["ended_at"])
        overlaps += gap < 0
        gaps_ms.append(gap * 1000)
    report("queue", "overlapping runs", str(overlaps))
    if gaps_ms:
        p50, p99 = percentile(gaps_ms, 50), percentile(gaps_ms, 99)
        verdict = "met" if p99 <= 50 else "not met"
        figures = f"{p50:.1f} / {p99:.1f} ms (target: within 50 ms, {verdict})"
        report("queue", "start gap p50 / p99", figures)


def _seconds(timestamp: str) -> float:
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def main() -> None:
    with throwaway_cluster("threadline-bench-") as database_url, TimedUpstream() as upstream:
        run_loop(run(database_url, upstream))


if __name__ == "__main__":
    main()
