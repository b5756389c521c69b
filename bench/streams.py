"""Streaming benchmark: what an ask adds before the first delta, and how many SSE streams one
`threadline serve` carries with its default settings, each beside a bare relay measured in the
same run.

Prints figures only. Run with `python -m bench.streams` (`make bench`); `--quick` (or
BENCH_QUICK=1) runs fewer asks and only the first steps, to iterate; BENCH_PROFILE=<dir> has
py-spy (the dev extra) sample each server into <dir>/<name>.txt (collapsed stacks).

The served process is the real thing: `threadline serve` (API and workers) in an OS process of
its own, at its default settings (only the model and its upstream are configured), on a
throwaway embedded cluster at Postgres's defaults (durable). The baseline, bench/relay.py,
relays the same fake upstream to SSE through the same SDK in an OS process of its own, with no
database, auth or queue. The fake OpenAI upstream (a thread) and the load generator (httpx on
uvloop) share this process. Each phase prints the CPU the server (or relay), Postgres, this
process and the rest of the machine used, so a saturated load generator, or a busy shared
machine, shows.

1. Ask overhead: POST /ask (stream: true) to the first `message.delta` at the client, less the
   fake upstream's own time (request received to first chunk sent), one ask at a time and
   200 at once (there also the time to the first token, all included); beside it the floor,
   one durable single-row INSERT round trip with asyncpg (autocommit: its own fsync'd commit).
2. Concurrent streams: N asks at once, the upstream sending 50 tokens/s for 10 s each; per
   token, the added latency from the fake sending it to the client receiving it, and the gap
   between consecutive deltas at the client; every stream's event ids and text checked. N steps
   up (100, 250, 500, 750, 1000) while both p99s stay within the bound.
3. Slow readers: 100 streams, 10 of which stop reading for a while mid-stream; the other 90
   against the bound, the 10 checked for every event once they read again, and the server's
   memory before and during the stall.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Coroutine, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, TypeVar

import asyncpg
import httpx
from starlette.requests import Request

from app.config import Settings
from app.db.embedded import throwaway_cluster
from app.db.engine import create_engine, libpq_url
from app.services.keys import create_key
from bench.journal import report
from testkit.server import free_port, wait_ready
from testkit.sse_client import TERMINAL, events
from testkit.upstream import FakeUpstream, Json, Script, Step, Text

T = TypeVar("T")

MODEL = "openai:gpt-4o-mini"
# `--quick` or BENCH_QUICK=1: fewer asks, the first steps only, a shorter stall.
QUICK = "--quick" in sys.argv[1:] or os.environ.get("BENCH_QUICK", "") not in ("", "0")
STEPS = (50, 100) if QUICK else (50, 100, 150, 200, 300, 500, 750, 1000)
SEQUENTIAL_ASKS, WARMUP_ASKS = (30, 5) if QUICK else (100, 5)
BURST = 200
FLOOR_INSERTS, FLOOR_WARMUP = 200, 10
OVERHEAD_TEXTS = ("t0 ", "t1 ", "t2 ")
STREAM_TOKENS, TOKEN_DELAY = 500, 0.02  # 50 tokens/s: 10 s per stream
STREAM_TEXTS = tuple(f"t{i} " for i in range(STREAM_TOKENS))
BOUND_MS = 150.0  # p99 of both the added latency and the gap between deltas
STREAM_TIMEOUT = 90.0  # a stream not finished by then counts as unfinished
BUDGET_SECONDS = 120.0 if QUICK else 400.0  # no further step starts past this (per target)
SLOW_STREAMS, SLOW_STALLED = 100, 10
STALL_SECONDS = 10.0 if QUICK else 30.0
STALL_AFTER_DELTAS = 25  # a stalled reader stops reading after this many deltas
CREATE_CONCURRENCY = 32
SETTLE_SECONDS = 0.5  # after the last plain ask, before its CPU is read
TAG = re.compile(r"bench-[0-9a-f]{12}")
THREADLINE = os.path.join(os.path.dirname(sys.executable), "threadline")
# BENCH_PROFILE=<dir>: py-spy samples each server while it is measured, into <dir>/<name>.txt.
PROFILE_DIR = os.environ.get("BENCH_PROFILE", "")
PROFILE_RATE = os.environ.get("BENCH_PROFILE_RATE", "100")  # samples per second
# Only what the benchmark must configure: everything else is `threadline serve`'s default.
SERVER_ENV: dict[str, object] = {
    "openai_api_key": "sk-bench",
    "default_model": MODEL,
    "log_level": "warning",  # no access log line per request
}
SHOWN_SETTINGS = (
    "fsync",
    "synchronous_commit",
    "wal_sync_method",
    "full_page_writes",
    "shared_buffers",
    "max_connections",
)
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


# --- The fake upstream, timed --------------------------------------------------------------


@dataclass
class Trace:
    """What the fake upstream did for one tagged request (perf_counter seconds)."""

    received: float = 0.0
    sent: list[float] = field(default_factory=list)  # when each text chunk went out


@dataclass(frozen=True)
class TracedScript(Script):
    trace: Trace = field(default_factory=Trace)


class TimedUpstream(FakeUpstream):
    """FakeUpstream answering each request by the tag in its last message, with timestamps.

    The base class's FIFO is global; concurrent asks need their answer picked per request.
    """

    def __init__(self) -> None:
        super().__init__()
        self._planned: dict[str, TracedScript] = {}

    def __enter__(self) -> TimedUpstream:
        self.start()
        return self

    def plan(self, tag: str, texts: Sequence[str], token_delay: float) -> Trace:
        """The answer to the request whose last message carries `tag`."""
        script = TracedScript(tuple(Text(t) for t in texts), token_delay)
        with self._lock:
            self._planned[tag] = script
        return script.trace

    async def _receive(self, request: Request) -> tuple[Json, Script]:
        received = time.perf_counter()
        body, script = await super()._receive(request)
        found = TAG.search(json.dumps(body.get("messages", [])[-1:]))
        with self._lock:
            planned = self._planned.pop(found.group(), None) if found else None
        if planned is None:
            return body, script
        planned.trace.received = received
        return body, planned

    async def _openai_chunks(
        self, model: str, script: Script, steps: Sequence[Step], include_usage: bool
    ) -> AsyncIterator[str]:
        # The first chunk carries only the role; one chunk per Text step follows.
        texts = sum(isinstance(step, Text) for step in steps)
        index = 0
        async for chunk in super()._openai_chunks(model, script, steps, include_usage):
            if isinstance(script, TracedScript) and 1 <= index <= texts:
                script.trace.sent.append(time.perf_counter())
            index += 1
            yield chunk


# --- Processes and CPU ---------------------------------------------------------------------


@dataclass(frozen=True)
class Server:
    name: str  # "threadline" or "relay"
    url: str
    pid: int


def server_env(database_url: str, upstream: TimedUpstream) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("THREADLINE_")}
    values = {
        **SERVER_ENV,
        "database_url": database_url,
        "openai_base_url": upstream.openai_base_url,
    }
    env.update({f"THREADLINE_{k.upper()}": str(v) for k, v in values.items()})
    return env


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)


@contextmanager
def launched(
    name: str,
    command: list[str],
    env: dict[str, str],
    port: int,
    *,
    pinned: bool = True,
    profiled: bool = True,
) -> Iterator[Server]:
    """A server (`command`) in an OS process of its own (on SERVER_CORE when `pinned`), until
    the block exits; sampled by py-spy throughout when BENCH_PROFILE is set and `profiled`."""
    url = f"http://127.0.0.1:{port}"
    logs = Path(tempfile.mkdtemp(prefix=f"threadline-bench-{name}-"))
    log = logs / f"{name}.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            on_server_core(command) if pinned else command,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    profiler: subprocess.Popen[bytes] | None = None
    try:
        wait_ready(url, process, log)
        if PROFILE_DIR and profiled:
            profiler = profile(process.pid, Path(PROFILE_DIR) / f"{name}.txt")
        yield Server(name, url, process.pid)
    finally:
        if profiler is not None:
            profiler.send_signal(signal.SIGINT)  # py-spy writes its samples, then exits
            profiler.wait(timeout=60)
        stop(process)
        logged = log.read_text(errors="replace")
        if "Traceback" in logged:  # what went wrong in the server, for the figures' sake
            tail = logged[logged.index("Traceback") :][:3000]
            print(f"{name} logged errors; the first:\n{tail}", file=sys.stderr)
        shutil.rmtree(logs, ignore_errors=True)


@contextmanager
def profiling(pid: int, name: str) -> Iterator[None]:
    """py-spy sampling `pid` through the block into BENCH_PROFILE/<name>.txt, if that is set."""
    if not PROFILE_DIR:
        yield
        return
    profiler = profile(pid, Path(PROFILE_DIR) / f"{name}.txt")
    try:
        yield
    finally:
        profiler.send_signal(signal.SIGINT)  # py-spy writes its samples, then exits
        profiler.wait(timeout=60)


def profile(pid: int, output: Path) -> subprocess.Popen[bytes]:
    """py-spy sampling `pid` until interrupted, into `output` (collapsed stacks: one line per
    stack, with its sample count; flamegraph.pl or speedscope read it)."""
    output.parent.mkdir(parents=True, exist_ok=True)
    py_spy = os.path.join(os.path.dirname(sys.executable), "py-spy")
    command = [py_spy, "record", "--pid", str(pid), "--format", "raw", "--rate", PROFILE_RATE]
    return subprocess.Popen(
        [*command, "--output", str(output)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


@contextmanager
def served(
    database_url: str,
    upstream: TimedUpstream,
    processes: int | None = None,
    *,
    profiled: bool = True,
) -> Iterator[Server]:
    """`threadline serve` (API and workers) in an OS process of its own, pinned; with
    `processes`, that many of them, unpinned (each may use any core). `profiled`: as
    `launched`."""
    port = free_port()
    command = [THREADLINE, "serve", "--port", str(port)]
    env = server_env(database_url, upstream)
    if processes is not None:
        env["THREADLINE_PROCESSES"] = str(processes)
    pinned = processes is None
    with launched("threadline", command, env, port, pinned=pinned, profiled=profiled) as server:
        yield server


@contextmanager
def relayed(upstream: TimedUpstream, journal_url: str | None = None) -> Iterator[Server]:
    """The bare relay (bench/relay.py) in an OS process of its own; with `journal_url`, making
    the two durable commits an ask must make before its first token ("relay+commits")."""
    port = free_port()
    command = [sys.executable, "-m", "bench.relay", "--port", str(port)]
    command += ["--upstream", upstream.openai_base_url]
    name = "relay"
    if journal_url is not None:
        command += ["--journal", libpq_url(journal_url)]
        name = "relay+commits"
    with launched(name, command, dict(os.environ), port) as server:
        yield server


def rss_mb(pid: int) -> float:
    """The resident memory of a process, MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def stat_fields(pid: int) -> list[str]:
    """/proc/<pid>/stat from field 3 (state) on: the command name may hold spaces."""
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()


def cpu_seconds(pid: int, *, reaped_children: bool = False) -> float:
    fields = stat_fields(pid)  # utime, stime, cutime, cstime are fields 14-17
    return sum(int(f) for f in fields[11 : 15 if reaped_children else 13]) / CLOCK_TICKS


def tree_cpu(root: int) -> float:
    """A process, its live descendants, and the children it has reaped (Postgres's postmaster
    and its backends; `threadline serve` and its worker processes)."""
    parents = parent_pids()
    total = cpu_seconds(root, reaped_children=True)
    for pid in descendants(root, parents):
        try:
            total += cpu_seconds(pid)
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
    return total


def parent_pids() -> dict[int, int]:
    """Every live process's parent, by pid."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int(stat_fields(int(entry.name))[1])
            except (OSError, IndexError, ValueError):
                continue  # gone meanwhile
    return parents


def descendants(root: int, parents: dict[int, int]) -> list[int]:
    """The pids under `root`, from a pid -> parent pid map."""
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


# --- Pinning -------------------------------------------------------------------------------
# The server under test (Threadline or the relay) on SERVER_CORE; this process (the load
# generator and the fake upstream's thread) and Postgres on LOAD_CORE, so that both servers
# get the same one core and the load generator does not take CPU from either.
LOAD_CORE, SERVER_CORE = 0, 1
PINNED = {LOAD_CORE, SERVER_CORE} <= os.sched_getaffinity(0)


def pin_load_generator() -> None:
    """Pin this process to LOAD_CORE before it starts threads or Postgres: both inherit it."""
    if PINNED:
        os.sched_setaffinity(0, {LOAD_CORE})


def pin_tree(root: int, core: int) -> None:
    """Pin a running process and its descendants (a postmaster started elsewhere) to `core`."""
    if not PINNED:
        return
    parents = parent_pids()
    for pid in (root, *descendants(root, parents)):
        try:
            os.sched_setaffinity(pid, {core})
        except OSError:
            continue  # gone meanwhile


def on_server_core(command: list[str]) -> list[str]:
    """`command` pinned to SERVER_CORE with taskset (its child processes inherit the pin)."""
    return ["taskset", "-c", str(SERVER_CORE), *command] if PINNED else command


def pinning() -> str:
    if not PINNED:
        return f"none (cores {sorted(os.sched_getaffinity(0))} available; needs 0 and 1)"
    return (
        f"server under test on core {SERVER_CORE} (taskset); load generator, fake upstream and"
        f" Postgres on core {LOAD_CORE}"
    )


@dataclass(frozen=True)
class Pids:
    name: str  # the server's: "threadline" or "relay"
    server: int
    postmaster: int


def machine_cpu() -> float:
    """CPU seconds all processes have used (every core), from /proc/stat."""
    ticks = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    idle = ticks[3] + ticks[4]  # idle, iowait
    return (sum(ticks) - idle) / CLOCK_TICKS


@dataclass(frozen=True)
class CpuSample:
    """Seconds: wall clock, and the CPU used so far by each named server process, Postgres,
    this bench and the whole machine."""

    wall: float
    processes: dict[str, float]
    postgres: float
    bench: float
    machine: float


def cpu_sample(processes: dict[str, int], postmaster: int) -> CpuSample:
    own = os.times()
    return CpuSample(
        wall=time.perf_counter(),
        processes={name: tree_cpu(pid) for name, pid in processes.items()},
        postgres=tree_cpu(postmaster),
        bench=own.user + own.system,
        machine=machine_cpu(),
    )


def server_cpu(pids: Pids) -> CpuSample:
    return cpu_sample({pids.name: pids.server}, pids.postmaster)


def cpu_use(before: CpuSample, after: CpuSample) -> str:
    """Each party's CPU use between two samples, in % of one core; others: the rest of the
    machine (it may be shared)."""
    wall = after.wall - before.wall

    def percent(used_before: float, used_after: float) -> float:
        return (used_after - used_before) / wall * 100

    shares = {
        name: percent(before.processes[name], after.processes[name]) for name in after.processes
    }
    shares["postgres"] = percent(before.postgres, after.postgres)
    shares["bench"] = percent(before.bench, after.bench)
    others = max(0.0, percent(before.machine, after.machine) - sum(shares.values()))
    parts = ", ".join(f"{name} {share:.0f}%" for name, share in shares.items())
    return (
        f"{parts}, other processes {others:.0f}% (of {100 * (os.cpu_count() or 1)}%)"
        f" over {wall:.1f} s"
    )


# --- Client --------------------------------------------------------------------------------


@dataclass
class Stream:
    """What the client saw of one ask: its event ids and deltas, timestamped."""

    started: float
    answered: float = 0.0  # response headers: the ask is committed
    status: int = 0
    ids: list[int] = field(default_factory=list)
    deltas: list[tuple[float, str]] = field(default_factory=list)
    terminal: str | None = None
    error: str | None = None

    @property
    def text(self) -> str:
        return "".join(text for _, text in self.deltas)


def new_tag() -> str:
    return f"bench-{uuid.uuid4().hex[:12]}"


async def create_sessions(client: httpx.AsyncClient, count: int) -> list[str]:
    gate = asyncio.Semaphore(CREATE_CONCURRENCY)

    async def one() -> str:
        async with gate:
            response = await client.post("/v1/sessions", json={"title": "bench"})
        response.raise_for_status()
        return str(response.json()["id"])

    return list(await asyncio.gather(*(one() for _ in range(count))))


async def read_stream(
    response: httpx.Response, stream: Stream, stall_after: int | None = None
) -> None:
    """Read to the terminal event; with `stall_after`, stop reading for STALL_SECONDS after
    that many deltas (the socket is left unread: the server's writes back up)."""
    async for event in events(response):
        now = time.perf_counter()
        stream.ids.append(event.id)
        if event.type == "message.delta":
            stream.deltas.append((now, event.data["text"]))
            if stall_after is not None and len(stream.deltas) == stall_after:
                await asyncio.sleep(STALL_SECONDS)
        if event.type in TERMINAL:
            stream.terminal = event.type
            if event.type != "run.completed":  # shown as the phase's first error
                stream.error = f"{event.type}: {json.dumps(event.data)}"[:300]
            return
    stream.error = stream.error or f"the stream ended after event {stream.ids[-1:]}, no terminal"


async def ask(
    client: httpx.AsyncClient, session_id: str, tag: str, stall_after: int | None = None
) -> Stream:
    """One streamed ask, read to its terminal event (or for STREAM_TIMEOUT at most)."""
    body = {"input": f"Please answer {tag}", "stream": True}
    stream = Stream(started=time.perf_counter())
    try:
        async with (
            asyncio.timeout(STREAM_TIMEOUT),
            client.stream("POST", f"/v1/sessions/{session_id}/ask", json=body) as response,
        ):
            stream.answered = time.perf_counter()
            stream.status = response.status_code
            if response.status_code != 200:
                stream.error = (await response.aread()).decode()[:200]
                return stream
            await read_stream(response, stream, stall_after)
    except (TimeoutError, httpx.HTTPError) as exc:
        stream.error = f"{type(exc).__name__}: {exc}"
    return stream


def client_for(server: Server, key: str, streams: int) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=server.url,
        headers={"Authorization": f"Bearer {key}"},
        timeout=httpx.Timeout(30, read=STREAM_TIMEOUT),
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=streams + 64),
    )


# --- Figures -------------------------------------------------------------------------------


def percentile(samples: Sequence[float], q: int) -> float:
    if len(samples) < 2:
        return samples[0] if samples else float("nan")
    return statistics.quantiles(samples, n=100, method="inclusive")[q - 1]


def spread(samples: Sequence[float]) -> str:
    return f"p50 {percentile(samples, 50):.2f} ms, p99 {percentile(samples, 99):.2f} ms"


def overhead_ms(stream: Stream, trace: Trace) -> float | None:
    """Client first delta minus the fake's own time from request to first chunk."""
    if not stream.deltas or not trace.sent:
        return None
    client = stream.deltas[0][0] - stream.started
    upstream = trace.sent[0] - trace.received
    return (client - upstream) * 1000


def stages_ms(stream: Stream, trace: Trace) -> tuple[float, float, float] | None:
    """The overhead in three legs: ask committed (response headers), from there to the
    upstream's request (queue, claim, projection), first chunk to first client delta."""
    if not stream.deltas or not trace.sent:
        return None
    return (
        (stream.answered - stream.started) * 1000,
        (trace.received - stream.answered) * 1000,
        (stream.deltas[0][0] - trace.sent[0]) * 1000,
    )


def first_token_ms(stream: Stream) -> float | None:
    """Ask sent to its first delta at the client, everything included."""
    return (stream.deltas[0][0] - stream.started) * 1000 if stream.deltas else None


def gaps_ms(stream: Stream) -> list[float]:
    """The time between consecutive deltas at the client (the upstream sends one token every
    TOKEN_DELAY: a longer gap is a stall somewhere on the way)."""
    times = [received for received, _ in stream.deltas]
    return [(b - a) * 1000 for a, b in itertools.pairwise(times)]


def added_latencies_ms(stream: Stream, trace: Trace) -> list[float]:
    """Per token: client receive time minus the fake's send time of that token."""
    out = []
    for received, text in stream.deltas:
        for token in text.split():
            index = int(token[1:]) if token[1:].isdigit() else -1
            if 0 <= index < len(trace.sent):
                out.append((received - trace.sent[index]) * 1000)
    return out


@dataclass
class Integrity:
    unfinished: int = 0  # no run.completed (failed, timed out, refused)
    lost: int = 0  # ids missing from 1..max
    duplicated: int = 0  # ids seen more than once
    mismatched: int = 0  # streams whose deltas do not spell the scripted text

    @property
    def clean(self) -> bool:
        return not (self.unfinished or self.lost or self.duplicated or self.mismatched)

    def add(self, stream: Stream, expected: str) -> None:
        self.unfinished += stream.terminal != "run.completed"
        distinct = set(stream.ids)
        self.duplicated += len(stream.ids) - len(distinct)
        self.lost += max(distinct, default=0) - len(distinct)
        self.mismatched += stream.text != expected

    def describe(self, streams: int) -> str:
        return (
            f"{streams - self.unfinished}/{streams} completed; events lost {self.lost}, "
            f"duplicated {self.duplicated}; text mismatches {self.mismatched}"
        )


def integrity(streams: Sequence[Stream], expected: str) -> Integrity:
    checked = Integrity()
    for stream in streams:
        checked.add(stream, expected)
    return checked


def first_error(streams: Sequence[Stream]) -> str | None:
    return next((s.error for s in streams if s.error), None)


# --- 1. Ask overhead ------------------------------------------------------------------------


async def floor_ms(database_url: str) -> list[float]:
    """Durable single-row INSERT round trips (autocommit: each is its own fsync'd commit)."""
    conn = await asyncpg.connect(libpq_url(database_url))
    try:
        await conn.execute("CREATE TABLE bench_floor (id bigserial PRIMARY KEY, body text)")
        samples = []
        for i in range(FLOOR_WARMUP + FLOOR_INSERTS):
            start = time.perf_counter()
            await conn.execute("INSERT INTO bench_floor (body) VALUES ($1)", f"row {i}")
            samples.append((time.perf_counter() - start) * 1000)
        await conn.execute("DROP TABLE bench_floor")
    finally:
        await conn.close()
    return samples[FLOOR_WARMUP:]


async def timed_ask(
    client: httpx.AsyncClient, upstream: TimedUpstream, session_id: str
) -> tuple[Stream, Trace]:
    tag = new_tag()
    trace = upstream.plan(tag, OVERHEAD_TEXTS, 0.0)
    return await ask(client, session_id, tag), trace


def report_overhead(
    area: str, label: str, results: Sequence[tuple[Stream, Trace]], floor: float | None
) -> None:
    samples = [o for s, t in results if (o := overhead_ms(s, t)) is not None]
    checked = integrity([s for s, _ in results], "".join(OVERHEAD_TEXTS))
    report(area, label, f"{spread(samples)} over {len(samples)}")
    if floor is not None:
        ratios = (
            f"p50 {percentile(samples, 50) / floor:.1f}, p99 {percentile(samples, 99) / floor:.1f}"
        )
        report(area, "  ratio to the floor's p50", ratios)
    firsts = [f for s, _ in results if (f := first_token_ms(s)) is not None]
    report(area, "  first token, all included", spread(firsts))
    legs = [leg for s, t in results if (leg := stages_ms(s, t)) is not None]
    if legs:
        committed, to_upstream, to_client = (statistics.median(x) for x in zip(*legs, strict=True))
        report(
            area,
            "  legs, p50 each",
            f"response headers {committed:.1f} ms, then upstream request {to_upstream:.1f} ms,"
            f" first chunk to client {to_client:.1f} ms",
        )
    report(area, "  streams", checked.describe(len(results)))
    if error := first_error([s for s, _ in results]):
        report(area, "  first error", error)


@dataclass
class Figures:
    """One server's figures for the comparison table (ms, streams)."""

    overhead_p50: float = float("nan")
    overhead_p99: float = float("nan")
    burst_p99: float = float("nan")  # first token, everything included
    burst_complete: bool = False
    cpu_per_ask: float = float("nan")
    streams: int | None = None


async def bench_overhead(
    client: httpx.AsyncClient,
    upstream: TimedUpstream,
    pids: Pids,
    floor: float | None,
    at_once: bool = True,
) -> Figures:
    """Ask overhead one at a time and (with `at_once`) 200 at once."""
    area = f"{pids.name[:6]} ask" if "+" not in pids.name else f"{pids.name} ask"
    figures = Figures()
    sessions = await create_sessions(client, WARMUP_ASKS + SEQUENTIAL_ASKS)
    for session in sessions[:WARMUP_ASKS]:
        await timed_ask(client, upstream, session)
    before = server_cpu(pids)
    sequential = [await timed_ask(client, upstream, s) for s in sessions[WARMUP_ASKS:]]
    await asyncio.sleep(SETTLE_SECONDS)  # the runs' ends and any work after them, counted
    after = server_cpu(pids)
    report_overhead(area, "1 at a time, overhead", sequential, floor)
    report(area, "  cpu", cpu_use(before, after))
    used = after.processes[pids.name] - before.processes[pids.name]
    figures.cpu_per_ask = used / len(sequential) * 1000
    report(area, "  server cpu per ask", f"{figures.cpu_per_ask:.2f} ms (the process tree's)")
    samples = [o for st, tr in sequential if (o := overhead_ms(st, tr)) is not None]
    figures.overhead_p50, figures.overhead_p99 = percentile(samples, 50), percentile(samples, 99)

    for round_ in ("warm-up", "measured") if at_once else ():
        sessions = await create_sessions(client, BURST)
        before = server_cpu(pids)
        burst = await asyncio.gather(*(timed_ask(client, upstream, s) for s in sessions))
        if round_ == "measured":
            report_overhead(area, f"{BURST} at once, overhead", burst, floor)
            report(area, "  cpu", cpu_use(before, server_cpu(pids)))
            firsts = [f for st, _ in burst if (f := first_token_ms(st)) is not None]
            figures.burst_p99 = percentile(firsts, 99)
            figures.burst_complete = integrity(
                [st for st, _ in burst], "".join(OVERHEAD_TEXTS)
            ).clean
        upstream.clear()
    return figures


# --- 2. Concurrent streams ------------------------------------------------------------------


@dataclass(frozen=True)
class StepResult:
    streams: int
    latencies: list[float]
    gaps: list[float]
    checked: Integrity
    cpu: str
    error: str | None
    memory: str

    @property
    def met(self) -> bool:
        return (
            bool(self.latencies)
            and self.checked.clean
            and percentile(self.latencies, 99) <= BOUND_MS
            and percentile(self.gaps, 99) <= BOUND_MS
        )


async def stream_step(
    client: httpx.AsyncClient, upstream: TimedUpstream, pids: Pids, count: int
) -> StepResult:
    sessions = await create_sessions(client, count)
    tags = [new_tag() for _ in sessions]
    traces = [upstream.plan(tag, STREAM_TEXTS, TOKEN_DELAY) for tag in tags]
    before = server_cpu(pids)
    with peak_rss(pids.server) as memory:
        streams = await asyncio.gather(
            *(ask(client, s, t) for s, t in zip(sessions, tags, strict=True))
        )
    cpu = cpu_use(before, server_cpu(pids))
    upstream.clear()
    return StepResult(
        count,
        [ms for s, t in zip(streams, traces, strict=True) for ms in added_latencies_ms(s, t)],
        [ms for s in streams for ms in gaps_ms(s)],
        integrity(streams, "".join(STREAM_TEXTS)),
        cpu,
        first_error(streams),
        memory.describe(count),
    )


@dataclass
class Memory:
    """A server's resident memory before a phase and its peak during it (MB)."""

    before: float
    peak: float

    def describe(self, streams: int) -> str:
        grown = self.peak - self.before
        return (
            f"{self.before:.0f} MB before, peak {self.peak:.0f} MB:"
            f" +{grown:.0f} MB, {grown * 1024 / streams:.0f} KB per stream"
        )


@contextmanager
def peak_rss(pid: int) -> Iterator[Memory]:
    """Sample the server's resident memory every 0.5 s in a thread while the block runs."""
    memory = Memory(rss_mb(pid), rss_mb(pid))
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.5):
            memory.peak = max(memory.peak, rss_mb(pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield memory
    finally:
        done.set()
        sampler.join()


def report_latency(area: str, label: str, latencies: list[float], gaps: list[float]) -> None:
    if latencies:
        report(area, f"{label} added latency", f"{spread(latencies)}, max {max(latencies):.1f} ms")
        report(area, "  gap between deltas", f"{spread(gaps)}, max {max(gaps):.1f} ms")
    else:
        report(area, f"{label} added latency", "no deltas")


def report_step(area: str, step: StepResult) -> None:
    report_latency(area, f"N={step.streams}", step.latencies, step.gaps)
    report(area, "  verdict", "meets the bound" if step.met else "misses the bound")
    report(area, "  integrity", step.checked.describe(step.streams))
    report(area, "  cpu", step.cpu)
    report(area, "  server memory (RSS)", step.memory)
    if step.error:
        report(area, "  first error", step.error)


async def bench_streams(
    client: httpx.AsyncClient, upstream: TimedUpstream, pids: Pids
) -> int | None:
    """Step N up while the bound holds; returns the largest N that met it. (Each server
    steps until it misses the bound itself: the stepping ends once both have.)"""
    area = f"{pids.name[:6]} N"
    started = time.monotonic()
    best: int | None = None
    for count in STEPS:
        if time.monotonic() - started > BUDGET_SECONDS:
            report(area, f"N={count}", "skipped (time budget spent)")
            break
        step = await stream_step(client, upstream, pids, count)
        report_step(area, step)
        if not step.met:
            break
        best = count
    largest = f"{best}" if best is not None else f"none (below {STEPS[0]})"
    if best == STEPS[-1]:
        largest += " (the largest step tried)"
    report(area, "largest N within the bound", largest)
    return best


# --- 3. Slow readers ------------------------------------------------------------------------


async def bench_slow_readers(
    client: httpx.AsyncClient, upstream: TimedUpstream, pids: Pids
) -> None:
    area = f"{pids.name[:6]} slow"
    sessions = await create_sessions(client, SLOW_STREAMS)
    tags = [new_tag() for _ in sessions]
    traces = [upstream.plan(tag, STREAM_TEXTS, TOKEN_DELAY) for tag in tags]
    stalled = set(range(SLOW_STALLED))
    before = server_cpu(pids)
    with peak_rss(pids.server) as memory:
        streams = await asyncio.gather(
            *(
                ask(client, s, t, STALL_AFTER_DELTAS if i in stalled else None)
                for i, (s, t) in enumerate(zip(sessions, tags, strict=True))
            )
        )
    cpu = cpu_use(before, server_cpu(pids))
    upstream.clear()
    readers = [
        (s, t) for i, (s, t) in enumerate(zip(streams, traces, strict=True)) if i not in stalled
    ]
    latencies = [ms for s, t in readers for ms in added_latencies_ms(s, t)]
    gaps = [ms for s, _ in readers for ms in gaps_ms(s)]
    report(
        area,
        "setup",
        f"{SLOW_STREAMS} streams; {SLOW_STALLED} stop reading for {STALL_SECONDS:.0f} s after"
        f" {STALL_AFTER_DELTAS} deltas",
    )
    report_latency(area, f"the {SLOW_STREAMS - SLOW_STALLED} others:", latencies, gaps)
    met = (
        bool(latencies)
        and percentile(latencies, 99) <= BOUND_MS
        and percentile(gaps, 99) <= BOUND_MS
    )
    report(area, "  verdict", "meets the bound" if met else "misses the bound")
    expected = "".join(STREAM_TEXTS)
    report(area, "  integrity", integrity([s for s, _ in readers], expected).describe(len(readers)))
    stalled_streams = [streams[i] for i in sorted(stalled)]
    report(area, "the stalled ones", integrity(stalled_streams, expected).describe(len(stalled)))
    report(area, "server memory (RSS)", memory.describe(SLOW_STREAMS))
    report(area, "  cpu", cpu)
    if error := first_error(streams):
        report(area, "  first error", error)


# --- Running -------------------------------------------------------------------------------


async def print_header(
    database_url: str, title: str = "Threadline streaming benchmark", relay: bool = True
) -> int:
    """Print the setup (with the relay and the streams' bound unless `relay` is False: a bench
    of the served process alone); return the postmaster's pid."""
    conn = await asyncpg.connect(libpq_url(database_url))
    try:
        server_version = await conn.fetchval("SHOW server_version")
        shown = [f"{name}={await conn.fetchval(f'SHOW {name}')}" for name in SHOWN_SETTINGS]
        backend = int(await conn.fetchval("SELECT pg_backend_pid()"))
        postmaster = int(stat_fields(backend)[1])  # while the backend lives
    finally:
        await conn.close()
    pin_tree(postmaster, LOAD_CORE)
    print(title + (" (quick)" if QUICK else ""))
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"machine:  {os.cpu_count()} cores, load average {load} at start")
    print("database: throwaway embedded cluster at server defaults (durable)")
    print(f"postgres: {server_version}; {' '.join(shown)}")
    settings = " ".join(f"{k}={v}" for k, v in SERVER_ENV.items() if k != "openai_api_key")
    print(f"server:   `threadline serve` in its own process, default settings but {settings}")
    if relay:
        print("relay:    bench/relay.py (Starlette + uvicorn + openai SDK, no database) in its own")
    print("upstream: FakeUpstream (OpenAI streaming) in a thread of this process")
    print(f"pinning:  {pinning()}")
    print(f"client:   httpx {httpx.__version__} in this process, {loop_name()}")
    if relay:
        print(
            f"bound:    p99 added latency and p99 gap between deltas <= {BOUND_MS:.0f} ms,"
            " every stream complete and exact;"
            f" streams of {STREAM_TOKENS} tokens at {1 / TOKEN_DELAY:.0f}/s"
            f" (~{STREAM_TOKENS * TOKEN_DELAY:.0f} s)"
        )
    return postmaster


async def tenant_key(database_url: str) -> str:
    engine = create_engine(Settings(database_url=database_url, db_pool_size=1))
    try:
        return await create_key(engine, "bench")
    finally:
        await engine.dispose()


async def run(database_url: str, upstream: TimedUpstream) -> None:
    postmaster = await print_header(database_url)
    floor = await floor_ms(database_url)
    report("floor", "durable 1-row INSERT (asyncpg)", f"{spread(floor)} over {FLOOR_INSERTS}")
    floor_p50 = percentile(floor, 50)
    figures: dict[str, Figures] = {}
    with relayed(upstream) as relay:
        pids = Pids(relay.name, relay.pid, postmaster)
        async with client_for(relay, "relay", max(BURST, *STEPS)) as client:
            figures[relay.name] = await bench_overhead(client, upstream, pids, None)
            figures[relay.name].streams = await bench_streams(client, upstream, pids)
    # The floor of the invariants: the relay with the commits an ask must make (one at a time).
    with relayed(upstream, database_url) as floor_relay:
        pids = Pids(floor_relay.name, floor_relay.pid, postmaster)
        async with client_for(floor_relay, "relay", 8) as client:
            figures[floor_relay.name] = await bench_overhead(
                client, upstream, pids, floor_p50, at_once=False
            )
    key = await tenant_key(database_url)
    with served(database_url, upstream) as server:
        pids = Pids(server.name, server.pid, postmaster)
        async with client_for(server, key, max(BURST, *STEPS)) as client:
            figures[server.name] = await bench_overhead(client, upstream, pids, floor_p50)
            figures[server.name].streams = await bench_streams(client, upstream, pids)
            await bench_slow_readers(client, upstream, pids)
    print_comparison(figures["threadline"], figures["relay"], figures["relay+commits"])


@dataclass(frozen=True)
class Row:
    """One line of the comparison: a figure, Threadline's and the relay's, and the target as
    the largest (or with `at_least`, the smallest) ratio to the relay that meets it."""

    figure: str
    threadline: float
    relay: float
    target: float
    at_least: bool = False
    unit: str = "ms"
    also: bool = True  # a further condition (every ask completed)

    @property
    def ratio(self) -> float:
        return self.threadline / self.relay if self.relay else float("nan")

    @property
    def met(self) -> bool:
        ratio = self.ratio
        return self.also and (ratio >= self.target if self.at_least else ratio <= self.target)


def print_table(title: str, rows: Sequence[Row], names: tuple[str, str]) -> None:
    """The figures side by side, with ratio, target and verdict (a NaN is never met)."""
    print()
    print(title + ("; pinned" if PINNED else "; NOT pinned") + (", quick run" if QUICK else ""))
    width = max(len(r.figure) for r in rows)
    head = f"{'figure':<{width}}  {names[0]:>11}  {names[1]:>11}  {'ratio':>6}  {'target':>8}"
    print(head + "  verdict")
    for r in rows:
        target = f"{'>=' if r.at_least else '<='}{r.target:g}x"
        ratio = "n/a" if math.isnan(r.ratio) else f"{r.ratio:.2f}x"
        print(
            f"{r.figure:<{width}}  {r.threadline:>8.1f} {r.unit:<2}  {r.relay:>8.1f} {r.unit:<2}"
            f"  {ratio:>6}  {target:>8}  {'met' if r.met else 'NOT met'}"
        )


def print_comparison(threadline: Figures, relay: Figures, floor: Figures) -> None:
    rows = [
        Row("1. ask overhead p50, one at a time", threadline.overhead_p50, relay.overhead_p50, 2),
        Row("1. ask overhead p99, one at a time", threadline.overhead_p99, relay.overhead_p99, 3),
        Row(
            f"2. burst of {BURST}: first token p99",
            threadline.burst_p99,
            relay.burst_p99,
            3,
            also=threadline.burst_complete,
        ),
        Row(
            "3. concurrent streams within the bound",
            float(threadline.streams or 0),
            float(relay.streams or 0),
            0.75,
            at_least=True,
            unit="",
        ),
        Row(
            "4. server cpu per ask (per relayed request)",
            threadline.cpu_per_ask,
            relay.cpu_per_ask,
            3,
        ),
    ]
    print_table("Threadline beside the relay, same run", rows, ("threadline", "relay"))
    # What target 1 leaves for everything but the invariants' commits.
    floors = [
        Row("ask overhead p50, one at a time", floor.overhead_p50, relay.overhead_p50, 2),
        Row("ask overhead p99, one at a time", floor.overhead_p99, relay.overhead_p99, 3),
    ]
    print_table(
        "The relay making an ask's two durable commits (the invariants' floor) beside the relay",
        floors,
        ("+commits", "relay"),
    )
    print(f"(steps {', '.join(map(str, STEPS))}; statements per ask: bench.ask_path)")


def loop_name() -> str:
    try:
        return f"uvloop {version('uvloop')}"
    except PackageNotFoundError:
        return "asyncio"


def run_loop(main: Coroutine[Any, Any, T]) -> T:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def main() -> None:
    pin_load_generator()
    with throwaway_cluster("threadline-bench-") as database_url, TimedUpstream() as upstream:
        run_loop(run(database_url, upstream))


if __name__ == "__main__":
    main()
