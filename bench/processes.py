"""Every core: `threadline serve` with 1 and with 2 processes, unpinned, on the same machine
and database: the burst's first-token p99 and the concurrent streams within the bound.

Prints figures only. Run with `python -m bench.processes` (`make bench`); `--quick` (or
BENCH_QUICK=1) runs fewer steps. The phases and their bound are bench/streams.py's; here the
server is not pinned to a core (the load generator, fake upstream and Postgres still share the
machine with it), so the figures show what a second process adds on this machine.
"""

from __future__ import annotations

import os

from app.db.embedded import throwaway_cluster
from bench.journal import report
from bench.streams import (
    BURST,
    STEPS,
    Figures,
    Pids,
    TimedUpstream,
    bench_overhead,
    bench_streams,
    client_for,
    print_header,
    run_loop,
    served,
    tenant_key,
)

PROCESSES = (1, 2)


async def run(database_url: str, upstream: TimedUpstream) -> None:
    postmaster = await print_header(database_url, relay=False, title="Processes benchmark")
    print(f"cores:    {len(os.sched_getaffinity(0))} usable; nothing pinned")
    key = await tenant_key(database_url)
    figures: dict[int, Figures] = {}
    for processes in PROCESSES:
        with served(database_url, upstream, processes) as server:
            pids = Pids(f"threadline x{processes}", server.pid, postmaster)
            async with client_for(server, key, max(BURST, *STEPS)) as client:
                figures[processes] = await bench_overhead(client, upstream, pids, None)
                figures[processes].streams = await bench_streams(client, upstream, pids)
    for processes, measured in figures.items():
        streams = measured.streams if measured.streams is not None else "none"
        report(
            "processes",
            f"{processes} process(es): burst of {BURST} first-token p99 / streams",
            f"{measured.burst_p99:,.0f} ms / {streams}",
        )
    one, two = figures[1], figures[2]
    if one.burst_p99 and two.burst_p99:
        report("processes", "burst p99, 1 process / 2", f"{one.burst_p99 / two.burst_p99:.2f}x")


def main() -> None:
    with throwaway_cluster("threadline-bench-") as database_url, TimedUpstream() as upstream:
        run_loop(run(database_url, upstream))


if __name__ == "__main__":
    main()
