"""Ask path benchmark: the SQL statements and the server CPU one ask costs.

Prints figures only. Run with `python -m bench.ask_path` (`make bench`); BENCH_QUICK=1 (or
`--quick`) runs fewer asks; BENCH_PROFILE=<dir> has py-spy sample the server through each
measured phase into <dir>/ask_path-<phase>.txt (BENCH_PROFILE_RATE samples a second).
Figures that load on a shared machine barely changes: statements
counted by Postgres (pg_stat_statements, top-level statements: each is one round trip, BEGIN
and COMMIT included), and the CPU time (user + system) of the `threadline serve` process.

`threadline serve` at its default settings (as bench/streams.py starts it) on a throwaway
embedded cluster with pg_stat_statements loaded; N streamed asks, one at a time, each in a
fresh session, each read to its terminal event against the instant fake upstream (so an ask
here is its whole life: auth, commit, handoff, the run, its end); then as many asks one after
another in one session (a conversation: its history grows, and is read). The statements the server
runs while idle (pollers, heartbeats) are measured over as long a quiet spell and taken off.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
import time
from collections import Counter
from dataclasses import dataclass

import asyncpg
import httpx

from app.db.embedded import throwaway_cluster
from app.db.engine import libpq_url
from bench.journal import report
from bench.streams import (
    Pids,
    TimedUpstream,
    client_for,
    cpu_seconds,
    create_sessions,
    print_header,
    profiling,
    run_loop,
    served,
    tenant_key,
    timed_ask,
    tree_cpu,
)

QUICK = "--quick" in sys.argv[1:] or os.environ.get("BENCH_QUICK", "") not in ("", "0")
ASKS, WARMUP = (20, 5) if QUICK else (60, 10)
SHOWN_STATEMENTS = 40
STATS_SETTINGS = {
    "shared_preload_libraries": "pg_stat_statements",
    "pg_stat_statements.track": "top",  # a statement run inside a function is not a round trip
    "pg_stat_statements.max": "5000",
    "pg_stat_statements.track_planning": "on",
}
# Where a statement comes from, by what it touches (first match wins).
ORIGINS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (origin, re.compile(pattern, re.IGNORECASE | re.DOTALL))
    for origin, pattern in (
        ("transaction (BEGIN/COMMIT/...)", r"^\s*(BEGIN|COMMIT|ROLLBACK|SAVEPOINT|RELEASE)\b"),
        ("pool ping (SELECT 1)", r"^\s*SELECT (1|\$1)\s*$"),
        ("procrastinate (queue)", r"procrastinate"),
        ("auth and rate (api_keys)", r"\bapi_keys\b|tenant_request_counts"),
        ("quotas (tenants, limits, usage)", r"\btenant_limits\b|\btenant_usage\b|\btenants\b"),
        ("run events", r"\brun_events\b"),
        ("runs", r"\bruns\b"),
        ("journal (entries)", r"\bentries\b"),
        ("sessions", r"\bsessions\b"),
        ("memories", r"\bmemories\b"),
        ("webhooks", r"\bwebhook_"),
        ("notify/listen", r"\b(pg_notify|NOTIFY|LISTEN|UNLISTEN)\b"),
    )
)


def origin(query: str) -> str:
    return next((name for name, pattern in ORIGINS if pattern.search(query)), "other")


@dataclass(frozen=True)
class Snapshot:
    calls: Counter[str]  # per normalised statement text
    exec_ms: Counter[str]  # the time Postgres spent planning and executing them
    server_cpu: float
    postgres_cpu: float
    wall: float


async def snapshot(conn: asyncpg.Connection, pids: Pids) -> Snapshot:
    rows = await conn.fetch(
        "SELECT query, calls, total_exec_time, total_plan_time FROM pg_stat_statements"
        " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
        " AND query NOT LIKE '%pg_stat_statements%'"
    )
    calls: Counter[str] = Counter()
    exec_ms: Counter[str] = Counter()
    for row in rows:
        calls[" ".join(row["query"].split())] += row["calls"]
        exec_ms[" ".join(row["query"].split())] += row["total_exec_time"] + row["total_plan_time"]
    return Snapshot(
        calls,
        exec_ms,
        cpu_seconds(pids.server),
        tree_cpu(pids.postmaster),
        time.perf_counter(),
    )


def per_ask(
    before: Snapshot, after: Snapshot, idle: Counter[str], idle_seconds: float
) -> dict[str, float]:
    """Calls per ask of each statement, less what idling as long would have run."""
    seconds = after.wall - before.wall
    out: dict[str, float] = {}
    for query in after.calls:
        ran: float = after.calls[query] - before.calls.get(query, 0)
        ran -= idle.get(query, 0) * seconds / idle_seconds
        if ran > 0.5:
            out[query] = ran / ASKS
    return out


@dataclass(frozen=True)
class Measured:
    before: Snapshot
    after: Snapshot
    failed: int


async def measured(
    client: httpx.AsyncClient,
    upstream: TimedUpstream,
    stats: asyncpg.Connection,
    pids: Pids,
    sessions: list[str],
) -> Measured:
    """One ask in each of `sessions` (a session may repeat: a conversation), one at a time."""
    before = await snapshot(stats, pids)
    failed = 0
    for session in sessions:
        stream, _ = await timed_ask(client, upstream, session)
        failed += stream.terminal != "run.completed"
    return Measured(before, await snapshot(stats, pids), failed)


async def run(database_url: str, upstream: TimedUpstream) -> None:
    postmaster = await print_header(database_url, "Threadline ask path benchmark", relay=False)
    stats = await asyncpg.connect(libpq_url(database_url))
    await stats.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    key = await tenant_key(database_url)
    try:
        with served(database_url, upstream, profiled=False) as server:
            pids = Pids(server.name, server.pid, postmaster)
            async with client_for(server, key, 8) as client:
                sessions = await create_sessions(client, WARMUP + ASKS + 1)
                for session in sessions[:WARMUP]:
                    await timed_ask(client, upstream, session)
                # What the server runs while idle, over about as long as the asks take.
                await asyncio.sleep(1.0)  # the warm-up's runs wound down
                idle_before = await snapshot(stats, pids)
                await asyncio.sleep(3.0 if QUICK else 6.0)
                idle_after = await snapshot(stats, pids)
                idle = idle_after.calls - idle_before.calls
                idle_seconds = idle_after.wall - idle_before.wall
                with profiling(server.pid, "ask_path-fresh"):
                    fresh = await measured(
                        client, upstream, stats, pids, sessions[WARMUP : WARMUP + ASKS]
                    )
                # The same number of asks, one after another in one session: a conversation
                # whose history grows (its tail read with its session).
                with profiling(server.pid, "ask_path-conversation"):
                    conversation = await measured(
                        client, upstream, stats, pids, [sessions[-1]] * ASKS
                    )
    finally:
        await stats.close()
    report_asks("ask path", fresh, idle, idle_seconds, shown=True)
    report_asks("ask path in one conversation", conversation, idle, idle_seconds, shown=False)


def report_asks(
    area: str, asks: Measured, idle: Counter[str], idle_seconds: float, shown: bool
) -> None:
    before, after = asks.before, asks.after
    statements = per_ask(before, after, idle, idle_seconds)
    report(area, "asks (one at a time, whole life)", f"{ASKS}, {ASKS - asks.failed} completed")
    report(area, "SQL statements per ask", f"{sum(statements.values()):.1f}")
    by_origin: dict[str, float] = {}
    for query, calls in statements.items():
        by_origin[origin(query)] = by_origin.get(origin(query), 0.0) + calls
    for name, calls in sorted(by_origin.items(), key=lambda item: -item[1]):
        report(area, f"  {name}", f"{calls:.1f}")
    idle_rate = sum(idle.values()) / idle_seconds
    report(area, "  (idle statements taken off)", f"{idle_rate:.1f}/s")
    server_ms = (after.server_cpu - before.server_cpu) / ASKS * 1000
    postgres_ms = (after.postgres_cpu - before.postgres_cpu) / ASKS * 1000
    report(area, "server CPU per ask", f"{server_ms:.1f} ms")
    report(area, "postgres CPU per ask", f"{postgres_ms:.1f} ms")
    if not shown:
        return
    print(f"\nstatements per ask, most frequent first (top {SHOWN_STATEMENTS}), with the mean")
    print("time Postgres spent planning and executing each (its commit's flush not included):")
    ranked = sorted(statements.items(), key=lambda item: -item[1])
    for query, calls in ranked[:SHOWN_STATEMENTS]:
        ran = after.calls[query] - before.calls.get(query, 0)
        mean = (after.exec_ms[query] - before.exec_ms.get(query, 0.0)) / ran if ran else 0.0
        print(f"  {calls:5.2f}  {mean:6.3f} ms  {origin(query)[:12]:<12}  {query[:130]}")
    print()


def main() -> None:
    with (
        throwaway_cluster("threadline-bench-", STATS_SETTINGS) as database_url,
        TimedUpstream() as upstream,
    ):
        run_loop(run(database_url, upstream))


if __name__ == "__main__":
    main()
