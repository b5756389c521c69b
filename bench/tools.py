"""Tool-loop benchmark: what one model-tools iteration costs beside the model, and how many
tool-running sessions one `threadline serve` plus one `threadline worker` carry.

Prints figures only. Run with `python -m bench.tools`.

1. Iteration overhead, in this process (bench.journal's database(): THREADLINE_DATABASE_URL,
   else a throwaway cluster at Postgres's defaults, durable). One iteration is what the worker
   does between two model calls, timed on the worker's own code: each session asks (the ask
   service), and its run is executed here by app.worker.run.execute_run, with the runtime a
   worker pool builds (engine, router, event writer flushing every tick) except that the
   router's openai:* models are a script in this process (Router.register): each call answers
   at once with one call of a no-op built-in, until the bench releases the final answer. An
   iteration runs from the end of one model stream to the next model call: commit the tool
   call, the loop head (the run's entries, next_step), execute through the registry, commit the
   result, the loop head and the projection for the next call; stages are read off the events
   the run emits. Timed on 10-, 10,000- and 100,000-entry sessions, alternately (the runs wait
   at their model calls: one works at a time); beside it, the full garbage collections of this
   process (each stalls its event loop).
2. Concurrent tool loops: `threadline serve` (API and workers) and `threadline worker`, each its
   own OS process, on one throwaway cluster (durable; max_connections raised so the pools fit).
   Each run does three calculator iterations and then answers; the fake OpenAI upstream (a
   thread of this process) picks each request's script by the tag in the run's user message.
   N sessions ask at once (stream: false, then GET /v1/runs/{id}?wait=true); N steps up while
   every run completes with an exact journal and p99 run duration stays under the bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import statistics
import subprocess
import tempfile
import time
from collections import deque
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from contextvars import ContextVar, copy_context
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import asyncpg
import httpx
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.requests import Request

from app.config import Settings
from app.core.entries import EntryKind
from app.db import journal as journal_db
from app.db.embedded import throwaway_cluster
from app.db.engine import create_engine, libpq_url
from app.db.jobs import cancel_job
from app.eventlog.registry import EventType
from app.eventlog.writer import EventWriter
from app.llm.base import Finish, ModelRequest, StreamEvent, TextDelta, ToolCallDelta
from app.llm.router import Route, Router
from app.services.asks import AskParams, ask
from app.services.journal import append_entries
from app.services.keys import create_key, tenant_for_key
from app.services.projection import project_for_run
from app.services.runs import get_run
from app.services.sessions import create_session
from app.tools.registry import ToolContext, builtin
from app.worker.lease import WorkerLease
from app.worker.run import execute_run
from app.worker.runtime import Runtime
from bench.journal import LOAD_BATCH, database, messages, report
from bench.projection import MODEL as PROJECTION_MODEL
from bench.projection import POLICY
from bench.streams import (
    CREATE_CONCURRENCY,
    TAG,
    THREADLINE,
    CpuSample,
    Server,
    TimedUpstream,
    client_for,
    cpu_sample,
    cpu_use,
    loop_name,
    new_tag,
    percentile,
    run_loop,
    server_env,
    stat_fields,
    stop,
    tenant_key,
)
from testkit.server import free_port, wait_ready
from testkit.upstream import Json, Script, Text, ToolCall

# --- 1. Iteration overhead ------------------------------------------------------------------

# 10 vs 10,000 as asked; 100,000 beside them: beyond the budget, length alone should not count.
SIZES = (10, 10_000, 100_000)
RATIOS = ((10_000, 10), (100_000, 10_000))
ITERATIONS, WARMUP_ITERATIONS = 50, 5
NOOP = "noop"
NOOP_TOOL: dict[str, Any] = {"name": NOOP, "kind": "builtin", "description": "Does nothing."}
# bench.projection's policy, windowing only: an automatic compaction would summarize the long
# sessions down to a few turns (and call the model); this measures the projection reading back
# only as far as the budget reaches, however long the journal.
LOOP_POLICY: dict[str, Any] = {**POLICY, "summarization": "none"}
# An iteration's stages, each ending with the event the worker emits as it finishes it: the
# commit of the model's tool call, the loop head that turns it into RunTools (the run's entries
# read back, next_step), the tool's execution, the commit of its result, and the loop head and
# the projection that make the next model call (ended by that call reaching the model).
STAGES = ("commit tool_call", "loop head", "execute", "commit tool_result", "loop head, project")
STAGE_ENDS = (
    "entry.committed tool_call",
    "tool_call",
    "tool_result",
    "entry.committed tool_result",
)


@builtin(NOOP)
async def noop(arguments: dict[str, Any], context: ToolContext) -> str:
    """Answers at once: what is timed is the executor around it."""
    return "ok"


@dataclass
class ModelTurns:
    """One run's model calls, as the scripted model sees them: each call reports when it
    arrived and streams the answer the bench releases for it."""

    arrived: asyncio.Queue[float] = field(default_factory=asyncio.Queue)
    answers: asyncio.Queue[tuple[StreamEvent, ...]] = field(default_factory=asyncio.Queue)
    answered: float = 0.0  # when the last answer's stream ended (perf_counter)


# The run a model call belongs to: each run's task carries its own.
TURNS: ContextVar[ModelTurns] = ContextVar("bench_tools_turns")


class ScriptedModel:
    """The model of every run, in this process (a Provider): no network, no tokens to wait
    for, so that what is timed between two calls is the worker alone."""

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        turns = TURNS.get()
        turns.arrived.put_nowait(time.perf_counter())
        for event in await turns.answers.get():
            yield event
        turns.answered = time.perf_counter()


def tool_turn(number: int) -> tuple[StreamEvent, ...]:
    return (ToolCallDelta(0, f"call_{number}", NOOP, "{}"), Finish("tool_calls"))


ANSWER_TURN: tuple[StreamEvent, ...] = (TextDelta("Done."), Finish("stop"))


class MarkedWriter(EventWriter):
    """The worker's event writer, noting when each event is emitted: an iteration's stages
    are read off the events its run emits between two model calls."""

    def __init__(self, engine: AsyncEngine, tick_seconds: float) -> None:
        super().__init__(engine, tick_seconds)
        self.marks: dict[str, list[tuple[float, str]]] = {}

    def emit(
        self, run_id: str, kind: EventType, data: dict[str, Any], *, urgent: bool = False
    ) -> None:
        label = f"{kind} {data.get('kind')}" if kind is EventType.ENTRY_COMMITTED else str(kind)
        self.marks.setdefault(run_id, []).append((time.perf_counter(), label))
        super().emit(run_id, kind, data, urgent=urgent)

    def take(self, run_id: str) -> list[tuple[float, str]]:
        return self.marks.pop(run_id, [])


@dataclass
class LoopSession:
    """A session with one run in progress, executed by the worker's own code in a task of this
    process; its tool iterations are released one by one."""

    size: int
    session_id: str
    run_id: str
    turns: ModelTurns = field(default_factory=ModelTurns)
    task: asyncio.Task[None] | None = None
    iteration: int = 0
    samples: dict[str, list[float]] = field(default_factory=dict)  # stage -> ms

    def add(self, stage: str, ms: float) -> None:
        self.samples.setdefault(stage, []).append(ms)

    def totals(self) -> list[float]:
        return [sum(parts) for parts in zip(*(self.samples[s] for s in STAGES), strict=True)]

    def clear(self) -> None:
        self.samples.clear()


def scripted_router(settings: Settings) -> Router:
    """The worker's router, its openai:* models served by the scripted model (through the
    Router's extension point: the rest of the route is the real one)."""
    router = Router(settings)
    model = ScriptedModel()
    router.register("openai", lambda name: Route("bench-scripted", name, lambda: model))
    return router


async def loop_session(runtime: Runtime, tenant: str, size: int) -> LoopSession:
    """`size` entries: filler messages, then an ask (its user message and run_start), whose run
    this process executes as a worker would."""
    engine, settings = runtime.engine, runtime.settings
    session = await create_session(
        engine, tenant, title="bench", metadata={}, config={"tools": [NOOP_TOOL]}
    )
    session_id = session.id
    filler = size - 2
    for first in range(0, filler, LOAD_BATCH):
        batch = messages(min(LOAD_BATCH, filler - first), first)
        await append_entries(engine, tenant, session_id, batch, expected_rev=None)
    params = AskParams(
        "Call the noop tool until told otherwise.",
        model=PROJECTION_MODEL,
        context_policy=LOOP_POLICY,
        run_policy={"max_iterations": WARMUP_ITERATIONS + ITERATIONS + 1},
    )
    run = (await ask(engine, settings, tenant, session_id, params)).run
    async with engine.begin() as conn:  # this process is the run's worker: no other takes it
        assert run.job_id is not None
        await cancel_job(conn, run.job_id)
    return LoopSession(size, session_id, run.id)


async def start_run(runtime: Runtime, s: LoopSession) -> None:
    """Execute the session's run (app.worker.run.execute_run) up to its first model call."""
    context = copy_context()
    context.run(TURNS.set, s.turns)
    s.task = asyncio.create_task(
        execute_run(runtime, s.run_id, lambda: None), name=f"run-{s.size}", context=context
    )
    await next_model_call(s)


async def next_model_call(s: LoopSession) -> float:
    """When the run's next model call arrived; fails if the run ended instead."""
    assert s.task is not None
    arrival = asyncio.ensure_future(s.turns.arrived.get())
    await asyncio.wait({arrival, s.task}, return_when=asyncio.FIRST_COMPLETED)
    if not arrival.done():
        arrival.cancel()
        s.task.result()  # raises what ended it, if anything did
        raise RuntimeError(f"the run of the {s.size:,}-entry session ended mid-loop")
    return arrival.result()


async def iterate(writer: MarkedWriter, s: LoopSession) -> None:
    """Answer the run's model call with a noop tool call; time what the worker does until its
    next model call, stage by stage."""
    s.iteration += 1
    writer.take(s.run_id)
    s.turns.answers.put_nowait(tool_turn(s.iteration))
    arrived = await next_model_call(s)
    started = s.turns.answered
    marks = [(t, label) for t, label in writer.take(s.run_id) if t >= started]
    bounds = [started]
    for label in STAGE_ENDS:
        end = next((t for t, seen in marks if seen == label and t >= bounds[-1]), None)
        if end is None:
            emitted = ", ".join(seen for _, seen in marks)
            raise RuntimeError(f"an iteration emitted no {label!r} event (it emitted: {emitted})")
        bounds.append(end)
    bounds.append(arrived)
    for stage, start, end in zip(STAGES, bounds[:-1], bounds[1:], strict=True):
        s.add(stage, (end - start) * 1000)


async def finish_run(engine: AsyncEngine, tenant: str, s: LoopSession) -> str:
    """Release the final answer; the run's status and tool entries once it has ended."""
    assert s.task is not None
    s.turns.answers.put_nowait(ANSWER_TURN)
    await s.task
    run = await get_run(engine, tenant, s.run_id)
    async with engine.connect() as conn:
        entries = await journal_db.run_entries(
            conn, s.session_id, run.input_seq, s.run_id, tenant_id=tenant
        )
    calls = sum(e.kind == EntryKind.TOOL_CALL for e in entries)
    results = sum(e.kind == EntryKind.TOOL_RESULT for e in entries)
    return f"{run.status.value}, {calls} tool calls and {results} results journaled"


def spread_ms(samples: Sequence[float]) -> str:
    return f"median {statistics.median(samples):.2f} ms, p99 {percentile(samples, 99):.2f} ms"


async def bench_iterations(url: str, source: str) -> None:
    settings = Settings(database_url=url, default_model=PROJECTION_MODEL)
    engine = create_engine(settings)
    writer = MarkedWriter(engine, settings.event_tick_seconds)
    # What worker_pool gives its jobs, the router aside; the writer flushes as the pool's does.
    lease = WorkerLease(engine)
    await lease.acquire()
    runtime = Runtime(engine, settings, scripted_router(settings), writer, lease)
    flushing = asyncio.create_task(writer.run(), name="event-writer")
    sessions: list[LoopSession] = []
    try:
        tenant = await tenant_for_key(engine, await create_key(engine, "bench-tools"))
        if tenant is None:
            raise RuntimeError("a freshly created key resolved to no tenant")
        report("loop", "database", source)
        report("loop", "runs", "app.worker.run.execute_run; the model scripted in-process")
        report("loop", "projection", f"{PROJECTION_MODEL}, {json.dumps(LOOP_POLICY)}")
        start = time.perf_counter()
        sessions += [await loop_session(runtime, tenant, size) for size in SIZES]
        loaded = f"{time.perf_counter() - start:.1f} s (appends of {LOAD_BATCH:,})"
        report("loop", f"load {' + '.join(f'{n:,}' for n in SIZES)} entries", loaded)
        for s in sessions:
            await start_run(runtime, s)
        # Alternating, so drift (autovacuum, a busy neighbour) weighs on every size alike; the
        # runs wait at their model calls, so only one of them works at a time.
        with GcPauses() as pauses:
            for rounds in (WARMUP_ITERATIONS, ITERATIONS):
                pauses.clear()
                for s in sessions:
                    s.clear()
                for _ in range(rounds):
                    for s in sessions:
                        await iterate(writer, s)
        for s in sessions:
            await report_iterations(engine, settings, tenant, s)
        by_size = {s.size: s for s in sessions}
        for big_size, small_size in RATIOS:
            report_ratio(by_size[big_size], by_size[small_size])
        report("loop", "python gen-2 GC in this process", pauses.describe())
        for s in sessions:
            report("loop", f"{s.size:,}-entry session's run", await finish_run(engine, tenant, s))
    finally:
        for task in [s.task for s in sessions if s.task is not None] + [flushing]:
            task.cancel()  # a run still going (the bench failed) is left unfinished
            with contextlib.suppress(BaseException):
                await task
        await writer.flush()
        await lease.release()
        await engine.dispose()


def report_ratio(big: LoopSession, small: LoopSession) -> None:
    label = f"ratio {big.size:,}/{small.size:,}"
    median = statistics.median(big.totals()) / statistics.median(small.totals())
    p99 = percentile(big.totals(), 99) / percentile(small.totals(), 99)
    report("loop", label, f"median {median:.2f}, p99 {p99:.2f} (design: ~1)")
    ratios = ", ".join(
        f"{stage} {stage_median(big, stage) / stage_median(small, stage):.2f}" for stage in STAGES
    )
    report("loop", "  stage medians", ratios)


class GcPauses:
    """Full (generation 2) collections of this process while the block runs: each one stops
    the event loop, whatever the iteration was doing."""

    def __init__(self) -> None:
        self.pauses: list[float] = []  # ms
        self._started = 0.0

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)

    def clear(self) -> None:
        self.pauses.clear()

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.pauses.append((time.perf_counter() - self._started) * 1000)

    def describe(self) -> str:
        if not self.pauses:
            return "none during the measured iterations"
        return (
            f"{len(self.pauses)} during the measured iterations, longest"
            f" {max(self.pauses):.0f} ms ({len(gc.get_objects()):,} objects tracked)"
        )


def stage_median(s: LoopSession, stage: str) -> float:
    return statistics.median(s.samples[stage])


async def report_iterations(
    engine: AsyncEngine, settings: Settings, tenant: str, s: LoopSession
) -> None:
    grown = s.size + 2 * s.iteration
    label = f"{s.size:,}-entry session"
    report("loop", label, f"{spread_ms(s.totals())} over {ITERATIONS} (grew to {grown:,})")
    stages = ", ".join(f"{stage} {stage_median(s, stage):.2f}" for stage in STAGES)
    report("loop", "  stage medians (ms)", stages)
    # What the run's next model call gets, as the worker projects it.
    projected = await project_for_run(engine, settings, await get_run(engine, tenant, s.run_id))
    meta = projected.projection.meta
    report(
        "loop",
        "  projects",
        f"{meta.entries_included:,} entries, {meta.estimated_tokens:,} of {meta.budget:,}"
        f" tokens (truncated: {meta.truncated})",
    )


# --- 2. Concurrent tool loops ---------------------------------------------------------------

MODEL = "openai:gpt-4o-mini"
TOOL_ITERATIONS = 3
TOKEN_DELAY = 0.01  # per streamed piece: a tool call is 3 pieces, the answer 4
ANSWER = ("Results: ", "7, ", "14, ", "21.")
STEPS = (10, 25, 50, 100, 200, 400, 800)
WORKERS = 400  # per process: the two together can run the largest step at once
POOL = 50  # per engine (each process has its own, serve a second for the API), as many overflow
MAX_CONNECTIONS = 500
BOUND_SECONDS = 10.0
RUN_TIMEOUT = 60.0  # a run not ended by then counts as unfinished
BUDGET_SECONDS = 75.0  # no further step starts past this (a step lasts RUN_TIMEOUT at most)
CALCULATOR: dict[str, Any] = {
    "name": "calculator",
    "kind": "builtin",
    "description": "Arithmetic",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
}


def expression(iteration: int) -> str:
    return f"{iteration} * 7"


def loop_scripts() -> list[Script]:
    """The model's answers for one run: a calculator call per iteration, then text."""
    calls = [
        Script(
            (ToolCall(f"call_{i}", "calculator", json.dumps({"expression": expression(i)})),),
            TOKEN_DELAY,
        )
        for i in range(1, TOOL_ITERATIONS + 1)
    ]
    return [*calls, Script(tuple(Text(t) for t in ANSWER), TOKEN_DELAY)]


@dataclass
class LoopPlan:
    """One run's scripts and what the upstream saw of it."""

    scripts: deque[Script]
    requests: int = 0
    fed: list[str] = field(default_factory=list)  # the last message of requests 2.. (tool)


class ToolUpstream(TimedUpstream):
    """Answers each request by the tag anywhere in its messages: after a tool call the last
    message is the tool's result, not the user's words, so TimedUpstream's lookup misses it."""

    def __init__(self) -> None:
        super().__init__()
        self._loops: dict[str, LoopPlan] = {}

    def __enter__(self) -> ToolUpstream:
        self.start()
        return self

    def plan_loop(self, tag: str) -> LoopPlan:
        plan = LoopPlan(deque(loop_scripts()))
        with self._lock:
            self._loops[tag] = plan
        return plan

    def forget(self) -> None:
        with self._lock:
            self._loops.clear()
        self.clear()

    async def _receive(self, request: Request) -> tuple[Json, Script]:
        body, script = await super()._receive(request)
        sent = body.get("messages") or []
        found = TAG.search(json.dumps(sent))
        with self._lock:
            plan = self._loops.get(found.group()) if found else None
            if plan is None:
                return body, script
            plan.requests += 1
            if plan.requests > 1 and sent and sent[-1].get("role") == "tool":
                plan.fed.append(str(sent[-1].get("content")))
            if plan.scripts:
                script = plan.scripts.popleft()
        return body, script


# --- Processes ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Deployment:
    url: str
    server: int  # pids
    worker: int
    postmaster: int
    server_workers: frozenset[int]  # procrastinate worker ids
    worker_workers: frozenset[int]


def process_env(database_url: str, upstream: ToolUpstream) -> dict[str, str]:
    env = server_env(database_url, upstream)
    env["THREADLINE_DEFAULT_MODEL"] = MODEL
    env["THREADLINE_WORKER_CONCURRENCY"] = str(WORKERS)
    env["THREADLINE_DB_POOL_SIZE"] = str(POOL)
    return env


@contextmanager
def spawned(
    args: Sequence[str], env: dict[str, str], log: Path
) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as sink:
        process = subprocess.Popen(args, env=env, stdout=sink, stderr=subprocess.STDOUT)
    try:
        yield process
    finally:
        stop(process)


async def procrastinate_workers(database_url: str) -> frozenset[int]:
    conn = await asyncpg.connect(libpq_url(database_url))
    try:
        rows = await conn.fetch("SELECT id FROM procrastinate_workers")
    finally:
        await conn.close()
    return frozenset(int(r["id"]) for r in rows)


def new_workers(
    database_url: str, known: frozenset[int], process: subprocess.Popen[bytes], log: Path
) -> frozenset[int]:
    """The procrastinate worker ids that appear beside `known` once `process` registers."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and process.poll() is None:
        found = asyncio.run(procrastinate_workers(database_url)) - known
        if found:
            return found
        time.sleep(0.2)
    raise RuntimeError(f"{process.args!r} never registered a worker:\n{log.read_text()[-2000:]}")


def postmaster_pid(database_url: str) -> int:
    async def backend() -> int:
        conn = await asyncpg.connect(libpq_url(database_url))
        try:
            pid = int(await conn.fetchval("SELECT pg_backend_pid()"))
            return int(stat_fields(pid)[1])  # while the backend lives
        finally:
            await conn.close()

    return asyncio.run(backend())


@contextmanager
def deployed(database_url: str, upstream: ToolUpstream) -> Iterator[Deployment]:
    """`threadline serve` and `threadline worker`, each an OS process, on one database."""
    env = process_env(database_url, upstream)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with (
        tempfile.TemporaryDirectory(prefix="threadline-bench-tools-") as logs,
        ExitStack() as stack,
    ):
        serve_log, worker_log = Path(logs) / "serve.log", Path(logs) / "worker.log"
        serve = stack.enter_context(
            spawned([THREADLINE, "serve", "--port", str(port)], env, serve_log)
        )
        wait_ready(url, serve, serve_log)
        server_workers = new_workers(database_url, frozenset(), serve, serve_log)
        worker = stack.enter_context(
            spawned([THREADLINE, "worker", "--concurrency", str(WORKERS)], env, worker_log)
        )
        worker_workers = new_workers(database_url, server_workers, worker, worker_log)
        yield Deployment(
            url,
            serve.pid,
            worker.pid,
            postmaster_pid(database_url),
            server_workers,
            worker_workers,
        )


# --- CPU ------------------------------------------------------------------------------------


def cpu_now(d: Deployment) -> CpuSample:
    return cpu_sample({"serve": d.server, "worker": d.worker}, d.postmaster)


# --- Client ---------------------------------------------------------------------------------


@dataclass
class RunResult:
    session_id: str
    tag: str
    plan: LoopPlan
    started: float
    ended: float = 0.0
    run_id: str | None = None
    status: str | None = None
    text: str | None = None
    attempts: int = 0
    queued: float | None = None  # seconds, created to started (the database's clock)
    error: str | None = None

    @property
    def seconds(self) -> float:
        return self.ended - self.started


async def create_tool_sessions(client: httpx.AsyncClient, count: int) -> list[str]:
    gate = asyncio.Semaphore(CREATE_CONCURRENCY)
    body = {"title": "bench-tools", "config": {"tools": [CALCULATOR]}}

    async def one() -> str:
        async with gate:
            response = await client.post("/v1/sessions", json=body)
        response.raise_for_status()
        return str(response.json()["id"])

    return list(await asyncio.gather(*(one() for _ in range(count))))


def seconds_between(start: str | None, end: str | None) -> float | None:
    if start is None or end is None:
        return None
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


async def tool_run(client: httpx.AsyncClient, result: RunResult) -> RunResult:
    """Ask (stream: false), then wait for the run's end."""
    body = {"input": f"Compute three products, {result.tag}", "stream": False}
    try:
        async with asyncio.timeout(RUN_TIMEOUT):
            asked = await client.post(f"/v1/sessions/{result.session_id}/ask", json=body)
            if asked.status_code != 202:
                result.error = f"ask answered {asked.status_code}: {asked.text[:200]}"
                return result
            result.run_id = str(asked.json()["id"])
            waited = await client.get(
                f"/v1/runs/{result.run_id}",
                params={"wait": "true", "timeout": RUN_TIMEOUT},
                timeout=RUN_TIMEOUT + 5,
            )
            waited.raise_for_status()
            run = waited.json()
    except (TimeoutError, httpx.HTTPError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
        return result
    finally:
        result.ended = time.perf_counter()
    result.status, result.text, result.attempts = run["status"], run["result"], run["attempts"]
    result.queued = seconds_between(run["created_at"], run["started_at"])
    if result.status != "completed":
        result.error = f"run {result.status}: {json.dumps(run.get('error'))[:200]}"
    return result


# --- Checks ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Journal:
    """One session's tool entries: counts, distinct tool_call_ids, results flagged errors."""

    calls: int
    distinct_calls: int
    results: int
    distinct_results: int
    error_results: int

    @property
    def exact(self) -> bool:
        counts = {self.calls, self.distinct_calls, self.results, self.distinct_results}
        return counts == {TOOL_ITERATIONS} and not self.error_results


JOURNAL_QUERY = """
SELECT session_id::text AS session_id,
       count(*) FILTER (WHERE kind = 'tool_call') AS calls,
       count(DISTINCT refs->>'tool_call_id') FILTER (WHERE kind = 'tool_call') AS distinct_calls,
       count(*) FILTER (WHERE kind = 'tool_result') AS results,
       count(DISTINCT refs->>'tool_call_id') FILTER (WHERE kind = 'tool_result')
           AS distinct_results,
       count(*) FILTER (WHERE kind = 'tool_result' AND (payload->>'is_error')::boolean)
           AS error_results
FROM entries
WHERE session_id = ANY($1::uuid[])
GROUP BY session_id
"""
JOBS_QUERY = """
SELECT worker_id, count(*) AS jobs FROM procrastinate_jobs
WHERE args->>'run_id' = ANY($1::text[]) GROUP BY worker_id
"""


@dataclass(frozen=True)
class Checks:
    journals: dict[str, Journal]
    jobs: dict[int | None, int]  # procrastinate worker id -> jobs


async def read_checks(database_url: str, results: Sequence[RunResult]) -> Checks:
    conn = await asyncpg.connect(libpq_url(database_url))
    try:
        rows = await conn.fetch(JOURNAL_QUERY, [r.session_id for r in results])
        jobs = await conn.fetch(JOBS_QUERY, [r.run_id for r in results if r.run_id])
    finally:
        await conn.close()
    journals = {
        str(r["session_id"]): Journal(
            int(r["calls"]),
            int(r["distinct_calls"]),
            int(r["results"]),
            int(r["distinct_results"]),
            int(r["error_results"]),
        )
        for r in rows
    }
    return Checks(journals, {r["worker_id"]: int(r["jobs"]) for r in jobs})


def expected_fed() -> list[str]:
    """The tool results the model should see, in order (the calculator's answers)."""
    return [str(i * 7) for i in range(1, TOOL_ITERATIONS + 1)]


@dataclass(frozen=True)
class Counters:
    """Where the database stands: read at once, no statistics delay."""

    next_xid: int  # transactions that wrote get one: durable commits
    wal_lsn: int  # bytes of WAL written so far

    def __sub__(self, other: Counters) -> Counters:
        return Counters(self.next_xid - other.next_xid, self.wal_lsn - other.wal_lsn)


COUNTERS_QUERY = """
SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS next_xid,
       pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint AS wal_lsn
"""


async def postgres_counters(database_url: str) -> Counters:
    conn = await asyncpg.connect(libpq_url(database_url))
    try:
        row = await conn.fetchrow(COUNTERS_QUERY)
    finally:
        await conn.close()
    assert row is not None
    return Counters(int(row["next_xid"]), int(row["wal_lsn"]))


# --- Steps ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    count: int
    results: list[RunResult]
    wall: float
    checks: Checks
    cpu: str
    postgres: Counters

    @property
    def completed(self) -> list[RunResult]:
        return [r for r in self.results if r.status == "completed"]

    @property
    def durations(self) -> list[float]:
        return [r.seconds for r in self.completed]

    @property
    def exact_journals(self) -> int:
        empty = Journal(0, 0, 0, 0, 0)
        return sum(self.checks.journals.get(r.session_id, empty).exact for r in self.results)

    @property
    def exact_upstream(self) -> int:
        """Runs whose model was asked exactly once per turn and saw every tool's result."""
        fed = expected_fed()
        return sum(
            r.plan.requests == TOOL_ITERATIONS + 1 and r.plan.fed == fed for r in self.results
        )

    @property
    def exact_text(self) -> int:
        return sum(r.text == "".join(ANSWER) for r in self.results)

    @property
    def clean(self) -> bool:
        n = self.count
        return (
            len(self.completed) == n
            and self.exact_journals == n
            and self.exact_upstream == n
            and self.exact_text == n
        )

    @property
    def met(self) -> bool:
        return self.clean and percentile(self.durations, 99) < BOUND_SECONDS


async def tool_step(
    client: httpx.AsyncClient, upstream: ToolUpstream, d: Deployment, database_url: str, count: int
) -> Step:
    sessions = await create_tool_sessions(client, count)
    pending = []
    for session_id in sessions:
        tag = new_tag()
        pending.append(RunResult(session_id, tag, upstream.plan_loop(tag), 0.0))
    counters = await postgres_counters(database_url)
    before = cpu_now(d)
    start = time.perf_counter()
    for r in pending:
        r.started = start
    results = await asyncio.gather(*(tool_run(client, r) for r in pending))
    wall = time.perf_counter() - start
    cpu = cpu_use(before, cpu_now(d))
    after = await postgres_counters(database_url)
    done = after - counters
    checks = await read_checks(database_url, results)
    upstream.forget()
    return Step(count, list(results), wall, checks, cpu, done)


def report_step(step: Step, d: Deployment) -> None:
    n = step.count
    label = f"N={n}"
    durations = step.durations
    if durations:
        timing = (
            f"p50 {percentile(durations, 50):.2f} s, p99 {percentile(durations, 99):.2f} s,"
            f" max {max(durations):.2f} s"
        )
    else:
        timing = "no run completed"
    verdict = "meets" if step.met else "misses"
    report("loops", f"{label} run duration", f"{timing} ({verdict} the bound)")
    rate = len(step.completed) / step.wall if step.wall else 0.0
    report(
        "loops",
        "  completed, wall, rate",
        f"{len(step.completed)}/{n} in {step.wall:.2f} s, {rate:.1f} runs/s"
        f" ({rate * (TOOL_ITERATIONS + 1):.0f} model calls/s, {rate * TOOL_ITERATIONS:.0f}"
        " tool calls/s)",
    )
    queued = [r.queued for r in step.completed if r.queued is not None]
    if queued:
        report(
            "loops",
            "  queued (created to started)",
            f"p50 {percentile(queued, 50):.2f} s, p99 {percentile(queued, 99):.2f} s",
        )
    report(
        "loops",
        "  journals exact (3 calls, 3 results)",
        f"{step.exact_journals}/{n}; upstream asked 4 times, fed each result: "
        f"{step.exact_upstream}/{n}; answer text exact: {step.exact_text}/{n}",
    )
    retried = sum(r.attempts > 1 for r in step.results)
    served = sum(v for k, v in step.checks.jobs.items() if k in d.server_workers)
    worked = sum(v for k, v in step.checks.jobs.items() if k in d.worker_workers)
    other = sum(step.checks.jobs.values()) - served - worked
    split = f"serve {served}, worker {worked}" + (f", unknown {other}" if other else "")
    report("loops", "  runs per process", f"{split}; retried attempts {retried}")
    pg = step.postgres
    report(
        "loops",
        "  postgres per run (all parties)",
        f"{pg.next_xid / n:.1f} write transactions, {pg.wal_lsn / n / 1024:.0f} KiB of WAL",
    )
    report("loops", "  cpu", step.cpu)
    if error := next((r.error for r in step.results if r.error), None):
        report("loops", "  first error", error)


async def bench_loops(database_url: str, upstream: ToolUpstream, d: Deployment) -> None:
    report(
        "loops",
        "per run",
        f"{TOOL_ITERATIONS} calculator iterations then a {len(ANSWER)}-piece answer;"
        f" {TOKEN_DELAY * 1000:.0f} ms per streamed piece (~{model_seconds() * 1000:.0f} ms of"
        " model time)",
    )
    report(
        "loops",
        "bound",
        f"p99 run duration (ask sent to the run's end) < {BOUND_SECONDS:.0f} s; every run"
        " completed, journal and answer exact",
    )
    key = await tenant_key(database_url)
    started = time.monotonic()
    best: int | None = None
    async with client_for_url(d.url, key, max(STEPS)) as client:
        for count in STEPS:
            if time.monotonic() - started > BUDGET_SECONDS:
                report("loops", f"N={count}", "skipped (time budget spent)")
                break
            step = await tool_step(client, upstream, d, database_url, count)
            report_step(step, d)
            if not step.met:
                break
            best = count
    largest = f"{best}" if best is not None else f"none (below {STEPS[0]})"
    if best == STEPS[-1]:
        largest += " (the largest step tried)"
    report("loops", "largest N within the bound", largest)


def model_seconds() -> float:
    pieces = TOOL_ITERATIONS * 3 + len(ANSWER)  # ToolCall streams its arguments in 3 pieces
    return pieces * TOKEN_DELAY


def client_for_url(url: str, key: str, streams: int) -> httpx.AsyncClient:
    return client_for(Server("threadline", url, 0), key, streams)


# --- Running --------------------------------------------------------------------------------


def print_header() -> None:
    print("Threadline tool-loop benchmark")
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"machine:  {os.cpu_count()} cores, load average {load} at start")


def print_deployment(database_url: str) -> None:
    async def version() -> str:
        conn = await asyncpg.connect(libpq_url(database_url))
        try:
            return str(await conn.fetchval("SHOW server_version"))
        finally:
            await conn.close()

    print(
        f"loops:    throwaway cluster (postgres {asyncio.run(version())}, server defaults,"
        f" durable, max_connections={MAX_CONNECTIONS}); `threadline serve` and `threadline"
        f" worker` in their own processes, worker_concurrency={WORKERS} and db_pool_size={POOL}"
        " each; default event_tick"
    )
    print(
        f"          FakeUpstream (OpenAI streaming) in a thread of this process; httpx"
        f" {httpx.__version__} on {loop_name()}"
    )


def main() -> None:
    print_header()
    with database() as (url, source):
        asyncio.run(bench_iterations(url, source))
    settings = {"max_connections": str(MAX_CONNECTIONS)}
    with (
        throwaway_cluster("threadline-bench-", settings) as database_url,
        ToolUpstream() as upstream,
        deployed(database_url, upstream) as deployment,
    ):
        print_deployment(database_url)
        run_loop(bench_loops(database_url, upstream, deployment))


if __name__ == "__main__":
    main()
