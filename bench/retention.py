"""Retention benchmark: what one purge pass costs as the service's history grows.

Each history holds N runs that ended (and were purged) days ago, 2,000 runs that ended within
the retention (20 events each: the replay logs streams still read) and 100 runs newly past it
(20 events each). It prints the median time of a pass deleting those 100 runs' events: the
retention job as it is (each run pruned once, then marked) and, beside it, the statement it
replaced (delete by every run that ever ended), with the ratio. Run with
`python -m bench.retention`; it uses THREADLINE_DATABASE_URL when set, else a throwaway
embedded cluster.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from collections.abc import Awaitable, Callable

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.config import Settings
from app.db.engine import create_engine
from app.services import retention
from app.services.keys import create_key, tenant_for_key
from app.services.sessions import create_session
from bench.journal import database

HISTORIES = (10_000, 100_000, 1_000_000)
LIVE_RUNS = 2_000
DUE_RUNS = 100
EVENTS_PER_RUN = 20
PASSES = 5
RETENTION_SECONDS = 3600
# The statement each pass ran before runs were marked as pruned.
EVERY_ENDED_RUN = text(
    "DELETE FROM run_events WHERE run_id IN (SELECT id FROM runs"
    " WHERE ended_at < now() - make_interval(secs => :retention))"
)


async def add_runs(
    engine: AsyncEngine, tenant: str, session: str, count: int, ended_ago: str, pruned: bool
) -> None:
    """`count` runs ended `ended_ago`; unless `pruned`, with their events."""
    async with engine.begin() as conn:
        ids = (
            await conn.execute(
                text(
                    "INSERT INTO runs (tenant_id, session_id, model, status, ended_at,"
                    " events_pruned) SELECT :tenant, :session, 'openai:bench', 'completed',"
                    f" now() - interval '{ended_ago}', :pruned FROM generate_series(1, :count)"
                    " RETURNING id"
                ),
                {"tenant": tenant, "session": session, "count": count, "pruned": pruned},
            )
        ).scalars()
        if not pruned:
            await add_events(conn, [str(i) for i in ids])


async def add_events(conn: AsyncConnection, run_ids: list[str]) -> None:
    await conn.execute(
        text(
            "INSERT INTO run_events (run_id, seq, type, data)"
            " SELECT r, s, 'message.delta', '{\"text\": \"a token\"}'"
            " FROM unnest(CAST(:ids AS uuid[])) AS r, generate_series(1, :n) AS s"
        ),
        {"ids": run_ids, "n": EVENTS_PER_RUN},
    )


async def make_due(engine: AsyncEngine, due: list[str]) -> None:
    """The due runs as they were before a pass: unmarked, with their events."""
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE runs SET events_pruned = false WHERE id = ANY(CAST(:ids AS uuid[]))"),
            {"ids": due},
        )
        await conn.execute(
            text("DELETE FROM run_events WHERE run_id = ANY(CAST(:ids AS uuid[]))"), {"ids": due}
        )
        await add_events(conn, due)
    async with engine.connect() as conn:
        await conn.execute(text("ANALYZE runs"))
        await conn.execute(text("ANALYZE run_events"))


async def median_ms(
    engine: AsyncEngine, due: list[str], one_pass: Callable[[], Awaitable[object]]
) -> float:
    times = []
    for _ in range(PASSES):
        await make_due(engine, due)
        started = time.perf_counter()
        await one_pass()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


async def run(url: str, source: str) -> None:
    engine = create_engine(Settings(database_url=url))
    try:
        print("Threadline retention benchmark")
        print(f"machine:  {os.cpu_count()} cores")
        print(f"database: {source}")
        print(
            f"each pass: {DUE_RUNS} runs newly past the retention, {LIVE_RUNS:,} within it,"
            f" {EVENTS_PER_RUN} events each; median of {PASSES} passes"
        )
        tenant = await tenant_for_key(engine, await create_key(engine, "bench-retention"))
        assert tenant is not None
        session = (await create_session(engine, tenant, title=None, metadata={}, config={})).id
        await add_runs(engine, tenant, session, LIVE_RUNS, "10 minutes", pruned=False)
        await add_runs(engine, tenant, session, DUE_RUNS, "2 hours", pruned=False)
        async with engine.connect() as conn:
            due = [
                str(i)
                for i in (
                    await conn.execute(
                        text(
                            "SELECT id FROM runs WHERE NOT events_pruned"
                            " AND ended_at < now() - interval '1 hour'"
                        )
                    )
                ).scalars()
            ]
        history = 0
        for size in HISTORIES:
            await add_runs(engine, tenant, session, size - history, "3 days", pruned=True)
            history = size

            async def marked() -> None:
                await retention.purge(
                    engine, event_retention_seconds=RETENTION_SECONDS, batch_size=500
                )

            async def every_ended_run() -> None:
                async with engine.begin() as conn:
                    await conn.execute(EVERY_ENDED_RUN, {"retention": RETENTION_SECONDS})

            now_ms = await median_ms(engine, due, marked)
            old_ms = await median_ms(engine, due, every_ended_run)
            print(
                f"history {size:>9,} runs: a pass {now_ms:8.1f} ms; deleting by every ended"
                f" run {old_ms:8.1f} ms ({old_ms / now_ms:.1f}x)"
            )
    finally:
        await engine.dispose()


def main() -> None:
    with database() as (url, source):
        asyncio.run(run(url, source))


if __name__ == "__main__":
    main()
