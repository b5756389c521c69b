"""Journal benchmark: fork cost, append throughput, bytes per entry, newest-page reads.

Prints figures only. Run with `python -m bench.journal`; it uses THREADLINE_DATABASE_URL when
set, else a throwaway embedded cluster left at Postgres's default (durable) settings.
"""

from __future__ import annotations

import asyncio
import functools
import os
import statistics
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.config import Settings
from app.core.entries import EntryKind, NewEntry
from app.db.embedded import throwaway_cluster
from app.db.engine import create_engine
from app.db.migrate import upgrade_to_head
from app.services.journal import append_entries, read_history
from app.services.keys import create_key, tenant_for_key
from app.services.search import search_history
from app.services.sessions import create_session, fork_session

BIG = 100_000
LOAD_BATCH = 1_000
CONTENT_CHARS = 200
FORKS = 20
APPENDS = 2_000
WRITERS = 16
READS = 50
PAGE = 50
# Overflow connections are closed when returned, so a pool smaller than the writer count would
# time connection set-up rather than appends.
POOL = 20
SHOWN_SETTINGS = ("fsync", "synchronous_commit", "full_page_writes", "shared_buffers")
FILLER = "lorem ipsum dolor sit amet, consectetur adipiscing elit; " * 4


@contextmanager
def database() -> Iterator[tuple[str, str]]:
    """(url, description): the configured database, else a throwaway embedded cluster."""
    configured = os.environ.get("THREADLINE_DATABASE_URL")
    if configured:
        upgrade_to_head(configured)
        yield configured, "THREADLINE_DATABASE_URL"
        return
    # No server settings: durability stays on, so append figures are honest.
    with throwaway_cluster("threadline-bench-") as url:
        yield url, "throwaway embedded cluster, server defaults"


def messages(count: int, first: int = 0) -> list[NewEntry]:
    return [
        NewEntry(
            kind=EntryKind.MESSAGE,
            payload={"role": "user", "content": f"message {first + i}: {FILLER}"[:CONTENT_CHARS]},
            refs={},
        )
        for i in range(count)
    ]


def report(area: str, label: str, value: str) -> None:
    print(f"{area:<8} {label + ':':<38} {value}")


async def median_ms(call: Callable[[], Awaitable[object]], times: int) -> float:
    samples = []
    for _ in range(times):
        start = time.perf_counter()
        await call()
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


async def new_session(engine: AsyncEngine, tenant: str, entries: int) -> str:
    session = await create_session(engine, tenant, title="bench", metadata={}, config={})
    session_id = session.id
    for first in range(0, entries, LOAD_BATCH):
        batch = messages(min(LOAD_BATCH, entries - first), first)
        await append_entries(engine, tenant, session_id, batch, expected_rev=None)
    return session_id


async def print_header(engine: AsyncEngine, source: str) -> None:
    async with engine.connect() as conn:
        version = (await conn.execute(text("SHOW server_version"))).scalar_one()
        shown = [
            f"{name}={(await conn.execute(text(f'SHOW {name}'))).scalar_one()}"
            for name in SHOWN_SETTINGS
        ]
    print("Threadline journal benchmark")
    print(f"machine:  {os.cpu_count()} cores")
    print(f"database: {source}")
    print(f"postgres: {version}; {' '.join(shown)}")
    print(f"pool:     {POOL} connections")


async def warm_pool(engine: AsyncEngine, size: int) -> None:
    """Open `size` connections at once, so no scenario pays for connection set-up."""
    barrier = asyncio.Barrier(size)

    async def hold() -> None:
        async with engine.connect() as conn:
            await conn.execute(text("SELECT 1"))
            await barrier.wait()

    await asyncio.gather(*(hold() for _ in range(size)))


async def bench_load(engine: AsyncEngine, tenant: str) -> str:
    start = time.perf_counter()
    big = await new_session(engine, tenant, BIG)
    seconds = time.perf_counter() - start
    rate = f"{seconds:.1f} s ({BIG / seconds:,.0f} entries/s)"
    report("load", f"{BIG:,} entries, appends of {LOAD_BATCH:,}", rate)
    return big


async def bench_fork(engine: AsyncEngine, tenant: str, big: str) -> None:
    small = await new_session(engine, tenant, 10)

    async def fork(session_id: str) -> None:
        await fork_session(engine, tenant, session_id, at_seq=None, title=None, metadata=None)

    await fork(small)  # the first call compiles the statements
    small_ms = await median_ms(lambda: fork(small), FORKS)
    big_ms = await median_ms(lambda: fork(big), FORKS)
    report("fork", "10-entry session", f"median {small_ms:.2f} ms over {FORKS}")
    report("fork", f"{BIG:,}-entry session", f"median {big_ms:.2f} ms over {FORKS}")
    report("fork", "ratio big/small", f"{big_ms / small_ms:.2f} (O(1) fork: ~1)")


async def appends_per_second(engine: AsyncEngine, tenant: str, targets: list[str]) -> float:
    """Single-entry appends, one task per target, APPENDS in all; entries per second."""
    each = APPENDS // len(targets)

    async def writer(session_id: str) -> None:
        for _ in range(each):
            await append_entries(engine, tenant, session_id, messages(1), expected_rev=None)

    start = time.perf_counter()
    await asyncio.gather(*(writer(s) for s in targets))
    return each * len(targets) / (time.perf_counter() - start)


async def bench_append(engine: AsyncEngine, tenant: str) -> None:
    await warm_pool(engine, WRITERS)
    own = [await new_session(engine, tenant, 0) for _ in range(WRITERS)]
    shared = await new_session(engine, tenant, 0)
    scenarios = {
        "1 writer, 1 session": own[:1],
        f"{WRITERS} writers, own sessions": own,
        f"{WRITERS} writers, 1 shared session": [shared] * WRITERS,
    }
    for label, targets in scenarios.items():
        rate = await appends_per_second(engine, tenant, targets)
        report("append", label, f"{rate:,.0f} entries/s ({APPENDS:,} single-entry appends)")


async def bench_size(engine: AsyncEngine) -> None:
    async with engine.connect() as conn:
        # VACUUM refuses to run inside a transaction block.
        conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
        await conn.execute(text("VACUUM ANALYZE entries"))
        count = (await conn.execute(text("SELECT count(*) FROM entries"))).scalar_one()
        total, table, other = (
            await conn.execute(
                text(
                    "SELECT pg_total_relation_size('entries'), pg_relation_size('entries'),"
                    " pg_table_size('entries') - pg_relation_size('entries')"
                )
            )
        ).one()
        indexes = (
            await conn.execute(
                text(
                    "SELECT indexrelid::regclass::text, pg_relation_size(indexrelid)"
                    " FROM pg_index WHERE indrelid = 'entries'::regclass ORDER BY 1"
                )
            )
        ).all()
    report("size", "entries (after VACUUM ANALYZE)", f"{count:,}, {total / 2**20:.1f} MiB in all")
    rows = [("total", total), ("table (main fork)", table), ("toast+fsm+vm", other)]
    rows += [(f"index {name}", size) for name, size in indexes]
    for name, size in rows:
        report("size", name, f"{size / count:.1f} B/entry")


async def bench_read(engine: AsyncEngine, tenant: str, big: str) -> None:
    small = await new_session(engine, tenant, 100)
    fork = await fork_session(engine, tenant, big, at_seq=None, title=None, metadata=None)

    async def newest(session_id: str) -> None:
        await read_history(
            engine,
            tenant,
            session_id,
            after_seq=None,
            before_seq=None,
            limit=PAGE,
            kinds=None,
            order="desc",
        )

    await newest(small)  # the first call compiles the statements
    small_ms = await median_ms(lambda: newest(small), READS)
    big_ms = await median_ms(lambda: newest(big), READS)
    fork_ms = await median_ms(lambda: newest(fork.id), READS)
    report("read", f"newest {PAGE}, 100-entry session", f"median {small_ms:.2f} ms over {READS}")
    report("read", f"newest {PAGE}, {BIG:,}-entry session", f"median {big_ms:.2f} ms over {READS}")
    report("read", f"newest {PAGE}, fork of the {BIG:,}", f"median {fork_ms:.2f} ms over {READS}")
    report("read", "ratio big/small", f"{big_ms / small_ms:.2f} (O(1) read: ~1)")


async def bench_search(engine: AsyncEngine, tenant: str, big: str) -> None:
    """Full-text search over the whole 100,000-entry thread: a rare word and a common one."""
    rare = NewEntry(
        kind=EntryKind.MESSAGE,
        payload={"role": "user", "content": "the zebracorn password is hidden here"},
        refs={},
    )
    await append_entries(engine, tenant, big, [rare], expected_rev=None)

    async def search(words: str) -> None:
        await search_history(engine, tenant, big, words, limit=10)

    await search("zebracorn")  # the first call compiles the statements
    for label, words in (("rare word (1 match)", "zebracorn"), ("common word", "lorem")):
        ms = await median_ms(functools.partial(search, words), READS)
        report("search", f"{BIG:,} entries, {label}", f"median {ms:.2f} ms over {READS}")


async def run(url: str, source: str) -> None:
    engine = create_engine(Settings(database_url=url, db_pool_size=POOL))
    try:
        await print_header(engine, source)
        tenant = await tenant_for_key(engine, await create_key(engine, "bench"))
        if tenant is None:
            raise RuntimeError("a freshly created key resolved to no tenant")
        big = await bench_load(engine, tenant)
        await bench_fork(engine, tenant, big)
        await bench_append(engine, tenant)
        await bench_size(engine)
        await bench_read(engine, tenant, big)
        await bench_search(engine, tenant, big)
    finally:
        await engine.dispose()


def main() -> None:
    with database() as (url, source):
        asyncio.run(run(url, source))


if __name__ == "__main__":
    main()
