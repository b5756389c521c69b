"""How many runs one process executes at once when THREADLINE_WORKER_CONCURRENCY is unset.

A run spends nearly all its time waiting on its model: meanwhile it holds memory and sockets
(its upstream connection; in `threadline serve`, its client's stream too), no CPU and no
database connection (those are taken per step and given back at once). So the limit follows
what the process can carry, not a small fixed number; the queue is there for overload:

    runs at once = min(MAX_RUNS, (open-file limit - RESERVED_FILES) // FILES_PER_RUN,
                       available memory // MEMORY_PER_RUN)

The open-file limit is first raised to its hard limit (what `ulimit -Hn` allows).
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)
# The most the formula gives: past it, one process's CPU (deltas to encode and send) is the
# bound, not what runs wait with; add processes (`threadline worker`, more API instances).
MAX_RUNS = 10_000
# Per run: its upstream socket, its client's SSE socket, and room for a tool's webhook call
# or a second client following it.
FILES_PER_RUN = 4
# Database pools, the embedded cluster's files, logs, imports: kept out of the runs' share.
RESERVED_FILES = 256
# Per waiting run, generously: bench/streams.py measures the server's resident memory growing
# by tens of KB per stream (and the bare relay's by about as much).
MEMORY_PER_RUN = 2 * 1024 * 1024
# When the limits cannot be read (not Linux/Unix): a number any small host carries.
FALLBACK_RUNS = 1000


def raise_open_file_limit() -> int:
    """Raise this process's soft open-file limit to its hard limit; returns the soft limit."""
    try:
        import resource
    except ImportError:  # not Unix
        return 0
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError):
            log.warning("could not raise the open-file limit from %d", soft)
    return int(soft) if soft != resource.RLIM_INFINITY else 1 << 20


def available_memory() -> int | None:
    """Bytes of memory available to new work (Linux's MemAvailable), None when unknown."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def runs_capacity(open_files: int | None, memory: int | None) -> int:
    """The formula of the module docstring, from the open-file limit and available memory
    (either unknown: it does not bound)."""
    bounds = [MAX_RUNS]
    if open_files:
        bounds.append((open_files - RESERVED_FILES) // FILES_PER_RUN)
    if memory is not None:
        bounds.append(memory // MEMORY_PER_RUN)
    if len(bounds) == 1:
        return FALLBACK_RUNS
    return max(1, min(bounds))


def default_concurrency() -> int:
    """Runs this process executes at once by default (raises the open-file limit first)."""
    return runs_capacity(raise_open_file_limit(), available_memory())
