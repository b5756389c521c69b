"""Session file benchmark: a 100,000-entry session exported to a file and imported back.

Prints figures only: time, entries per second, file size, and the process's resident memory
(RSS) above its level before each step, sampled while the step runs, for a 10,000-entry session
and a 100,000-entry one: streaming keeps the peak the same whatever the length. Run with
`python -m bench.export`; it uses THREADLINE_DATABASE_URL when set, else a throwaway embedded
cluster.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import TypeVar

from sqlalchemy.ext.asyncio import AsyncEngine

from app.api.session_files import session_fields
from app.config import Settings
from app.core.entries import EntryKind, NewEntry
from app.db.engine import create_engine
from app.services import session_files
from app.services.journal import append_entries
from app.services.keys import create_key, tenant_for_key
from app.services.sessions import create_session
from bench.journal import FILLER, database, report

SIZES = (10_000, 100_000)
LOAD_BATCH = 1_000
READ_CHUNK = 1 << 20
SAMPLE_SECONDS = 0.005
T = TypeVar("T")


def turn(n: int) -> list[NewEntry]:
    """Ten entries: a question, a tool call and its result, an answer, and six more messages."""
    call = f"call_{n}"
    return [
        NewEntry(EntryKind.MESSAGE, {"role": "user", "content": f"question {n}: {FILLER}"}, {}),
        NewEntry(
            EntryKind.TOOL_CALL,
            {"name": "lookup", "arguments": {"n": n}},
            {"tool_call_id": call, "call_id": f"g{n}"},
        ),
        NewEntry(EntryKind.TOOL_RESULT, {"content": {"found": n}}, {"tool_call_id": call}),
        *(
            NewEntry(
                EntryKind.MESSAGE,
                {"role": "assistant" if i % 2 else "user", "content": f"{n}.{i} {FILLER}"},
                {},
            )
            for i in range(7)
        ),
    ]


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def measured(step: Awaitable[T]) -> tuple[T, float, int]:
    """The step's result, its seconds, and the most RSS it took above the level before it."""
    base = peak = rss_bytes()
    done = False

    async def sample() -> None:
        nonlocal peak
        while not done:
            peak = max(peak, rss_bytes())
            await asyncio.sleep(SAMPLE_SECONDS)

    sampler = asyncio.create_task(sample())
    start = time.perf_counter()
    try:
        result = await step
    finally:
        done = True
        await sampler
    return result, time.perf_counter() - start, max(peak, rss_bytes()) - base


async def build(engine: AsyncEngine, tenant: str, size: int) -> str:
    sid = (await create_session(engine, tenant, title="bench", metadata={}, config={})).id
    batch: list[NewEntry] = []
    for n in range(size // 10):
        batch += turn(n)
        if len(batch) >= LOAD_BATCH:
            await append_entries(engine, tenant, sid, batch, expected_rev=None)
            batch = []
    if batch:
        await append_entries(engine, tenant, sid, batch, expected_rev=None)
    return sid


async def export_to(engine: AsyncEngine, tenant: str, sid: str, path: Path) -> int:
    with path.open("wb") as out:
        async for line in session_files.export_lines(engine, tenant, sid, memory=False):
            out.write(line)
        return out.tell()


async def import_from(engine: AsyncEngine, tenant: str, path: Path, settings: Settings) -> str:
    async def chunks() -> AsyncIterator[bytes]:
        with path.open("rb") as source:
            while chunk := source.read(READ_CHUNK):
                yield chunk

    session = await session_files.import_session(
        engine, tenant, chunks(), settings=settings, check_fields=session_fields
    )
    return session.id


def same_entries(first: Path, second: Path) -> bool:
    """Every line after the header is equal, read a line at a time."""
    with first.open("rb") as a, second.open("rb") as b:
        next(a), next(b)
        while (x := a.readline()) == b.readline():
            if not x:
                return True
        return False


def mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"


async def run(url: str, source: str) -> None:
    settings = Settings(database_url=url, db_pool_size=4)
    engine = create_engine(settings)
    print(f"database: {source}")
    try:
        tenant = await tenant_for_key(engine, await create_key(engine, "bench-export"))
        assert tenant is not None
        with tempfile.TemporaryDirectory(prefix="threadline-export-") as folder:
            for size in SIZES:
                sid = await build(engine, tenant, size)
                path = Path(folder) / f"{size}.jsonl"
                written, seconds, grew = await measured(export_to(engine, tenant, sid, path))
                area = f"{size:,}"
                report(area, "export time", f"{seconds:.2f} s ({size / seconds:,.0f} entries/s)")
                report(area, "export file", mib(written))
                report(area, "export RSS above start (peak)", mib(grew))
                copy, seconds, grew = await measured(import_from(engine, tenant, path, settings))
                report(area, "import time", f"{seconds:.2f} s ({size / seconds:,.0f} entries/s)")
                report(area, "import RSS above start (peak)", mib(grew))
                again = Path(folder) / f"{size}-again.jsonl"
                await export_to(engine, tenant, copy, again)
                same = same_entries(path, again)
                report(area, "re-export's entries equal the export's", "yes" if same else "NO")
        report("process", "peak RSS (whole run)", mib(peak_rss()))
    finally:
        await engine.dispose()


def peak_rss() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main() -> None:
    with database() as (url, source):
        asyncio.run(run(url, source))


if __name__ == "__main__":
    main()
