"""The in-process handoff: `threadline serve` starts its own asks' runs at once, each exactly
once although procrastinate's worker is told of the same jobs (or, committed taken by the
handoff, never hears of them), and a process killed after the handoff, or before its taken job's
run started, leaves its run to the durable job: another worker finishes it."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import secrets
import threading
import uuid
import weakref
from collections import Counter
from collections.abc import Callable, Collection
from contextlib import AbstractContextManager
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.config import Settings
from app.core.entries import EntryKind, NewEntry
from app.core.lineage import Segment
from app.core.runs import Run, RunStatus
from app.core.sessions import Session
from app.db import journal as journal_db
from app.db import runs as runs_db
from app.db.engine import create_engine
from app.db.runs import FirstStart
from app.db.sessions import NEWEST_ENTRIES, Newest, RunStart
from app.eventlog.writer import EventWriter
from app.llm.router import Router
from app.main import create_app
from app.services import asks, run_transitions
from app.services.journal import append_in
from app.services.keys import tenant_for_key
from app.services.quotas import Limits
from app.services.sessions import create_session
from app.worker.handoff import Handoff
from app.worker.lease import WorkerLease
from app.worker.run import execute_started, start_first, start_locked
from app.worker.runtime import Runtime
from testkit.api import history, new_session
from testkit.server import free_port, serve_in_thread, stop_thread_server
from testkit.sse_client import collect
from testkit.statements import watching
from testkit.upstream import (
    DEFAULT_SCRIPT,
    FakeUpstream,
    Hold,
    ReceivedRequest,
    Script,
    Text,
    Usage,
)
from tests.conftest import issue_key
from tests.e2e import Process, create_database, e2e_env, process_env
from tests.worker.conftest import Workers


@pytest.fixture
def handoff_settings(database_url: str, upstream: FakeUpstream) -> tuple[Settings, str]:
    """A database of its own (no other test's workers take these runs), and a key."""
    settings = Settings(database_url=create_database(database_url, "handoff"), **e2e_env(upstream))
    return settings, issue_key(settings, f"handoff-{uuid.uuid4()}")


async def test_each_run_is_executed_once_though_the_queue_hears_of_it_too(
    handoff_settings: tuple[Settings, str], upstream: FakeUpstream
) -> None:
    settings, key = handoff_settings
    upstream.clear()
    asks = 12
    for i in range(asks):
        upstream.script(Text(f"answer {i}"), Usage(3, 2))
    app: FastAPI = create_app(settings, workers=4)  # fewer than the asks: some queue
    server, thread, url = serve_in_thread(app)
    try:
        headers = {"Authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as api:
            sessions = [(await new_session(api))["id"] for _ in range(asks)]
            streams = await asyncio.gather(
                *(
                    collect(api, "POST", f"/v1/sessions/{sid}/ask", json={"input": "q"})
                    for sid in sessions
                )
            )
            for events in streams:
                types = [e.type for e in events]
                assert types.count("run.started") == 1 and types[-1] == "run.completed"
                assert [e.id for e in events] == list(range(1, len(events) + 1))
                run = (await api.get(f"/v1/runs/{events[0].data['run_id']}")).json()
                assert run["attempts"] == 1
            for sid in sessions:
                kinds = Counter(e["kind"] for e in await history(api, sid))
                assert kinds == {"message": 2, "run_start": 1, "usage": 1, "run_end": 1}
        assert len(upstream.requests) == asks  # no run called the model twice
        handoff = app.state.handoff
        assert isinstance(handoff, Handoff) and handoff.claimed > 0
    finally:
        stop_thread_server(server, thread)
        upstream.clear()


@pytest.mark.slow
async def test_a_serve_process_killed_after_the_handoff_leaves_its_run_to_the_queue(
    handoff_settings: tuple[Settings, str], upstream: FakeUpstream
) -> None:
    """`threadline serve` takes its ask's run at once and is killed mid-answer (kill -9): a
    `threadline worker` started afterwards resumes the run from the journal and ends it."""
    settings, key = handoff_settings
    upstream.clear()
    upstream.script(*[Text(f"a{i} ") for i in range(200)], token_delay=0.03)  # killed midway
    upstream.script(Text("the retried "), Text("answer"), Usage(7, 3))
    port = free_port()
    env = process_env(settings, port=port, worker_concurrency=2)
    served = Process(["serve", "--port", str(port)], env, f"http://127.0.0.1:{port}/readyz")
    headers = {"Authorization": f"Bearer {key}"}
    workers: Workers | None = None
    api_server, api_thread, api_url = serve_in_thread(create_app(settings))  # API only
    try:
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=60
        ) as direct:
            sid = (await new_session(direct))["id"]
            asked = await collect(
                direct, "POST", f"/v1/sessions/{sid}/ask", json={"input": "q"}, stop_after=6
            )
        assert [e.type for e in asked].count("message.delta") >= 2
        run_id = asked[0].data["run_id"]
        served.kill()
        workers = Workers(process_env(settings, worker_concurrency=2))
        async with httpx.AsyncClient(base_url=api_url, headers=headers, timeout=90) as api:
            done = (
                await api.get(f"/v1/runs/{run_id}", params={"wait": "true", "timeout": 60})
            ).json()
            assert done["status"] == "completed", done
            assert done["result"] == "the retried answer" and done["attempts"] == 2
            events = await collect(api, "GET", f"/v1/runs/{run_id}/events")
            assert [e.id for e in events] == list(range(1, len(events) + 1))
            assert [e.type for e in events].count("run.completed") == 1
            kinds = Counter(e["kind"] for e in await history(api, sid))
            assert kinds == {"message": 2, "run_start": 1, "usage": 1, "run_end": 1}
        assert len(upstream.requests) == 2
    finally:
        served.stop()
        if workers is not None:
            workers.stop()
        stop_thread_server(api_server, api_thread)
        upstream.clear()


async def test_a_run_held_by_a_cancel_is_left_to_the_queue_with_its_claim_undone(
    handoff_settings: tuple[Settings, str],
) -> None:
    """The handoff claims the job, then takes the run's row without waiting: a cancel holding
    the run's row (it locks the job's next) makes it undo its claim rather than deadlock; the
    job stays queued for procrastinate's worker. Free, the same run is claimed and started."""
    settings, key = handoff_settings
    engine = create_engine(settings)
    try:
        tenant, session = await tenant_session(engine, key)
        asked = await asks.ask(engine, settings, tenant, session.id, asks.AskParams("q"))
        run_id, job_id = asked.run.id, asked.run.job_id
        assert job_id is not None
        async with engine.begin() as conn:
            worker_id = int(
                (
                    await conn.execute(
                        text("INSERT INTO procrastinate_workers DEFAULT VALUES RETURNING id")
                    )
                ).scalar_one()
            )
        runtime = runtime_of(engine, settings)
        execute = Executed()
        executed = execute.runs

        async with engine.connect() as holder:  # a cancel, between its two locks
            await holder.begin()
            assert await runs_db.get_run(holder, run_id, lock=True) is not None
            held = Handoff(runtime, [worker_id], 1, start_locked, execute)
            held.offer(run_id, job_id)
            await held.close(grace_seconds=60)  # waits for the handoff to give up
            await holder.rollback()
        assert held.claimed == 0 and executed == []
        async with engine.connect() as conn:
            job = (
                await conn.execute(
                    text("SELECT status, worker_id FROM procrastinate_jobs WHERE id = :id"),
                    {"id": job_id},
                )
            ).one()
            run = await runs_db.get_run(conn, run_id)
        assert (job.status, job.worker_id) == ("todo", None)
        assert run is not None and (run.status, run.attempts) == (RunStatus.QUEUED, 0)

        free = Handoff(runtime, [worker_id], 1, start_locked, execute)
        free.offer(run_id, job_id)
        await free.close(grace_seconds=60)
        assert free.claimed == 1
        assert [(r.id, r.status, r.attempts) for r in executed] == [(run_id, RunStatus.RUNNING, 1)]
        async with engine.connect() as conn:
            status = await conn.scalar(
                text("SELECT status FROM procrastinate_jobs WHERE id = :id"), {"id": job_id}
            )
        assert status == "succeeded"
    finally:
        await engine.dispose()


class Told:
    """This process's followers, as the event writer tells them (LocalFollowers)."""

    def __init__(self) -> None:
        self.expected: list[dict[str, Any]] = []
        self.published: list[dict[str, Any]] = []

    def expect(self, first: dict[str, Any]) -> None:
        self.expected.append(first)

    def publish(self, rows: list[dict[str, Any]]) -> None:
        self.published += rows

    def committing(self, run_ids: Collection[str]) -> AbstractContextManager[None]:
        return contextlib.nullcontext()


async def tenant_session(engine: AsyncEngine, key: str) -> tuple[str, Session]:
    """The key's tenant, and a new session of it."""
    tenant = await tenant_for_key(engine, key)
    assert tenant is not None
    return tenant, await create_session(engine, tenant, title=None, metadata={}, config={})


def runtime_of(engine: AsyncEngine, settings: Settings) -> Runtime:
    return Runtime(engine, settings, Router(settings), EventWriter(engine), WorkerLease(engine))


class Executed:
    """The handoff's execute, running nothing: the runs it was handed, and their starts' reads.
    It finishes no job (the handoff does)."""

    def __init__(self) -> None:
        self.runs: list[Run] = []
        self.starts: list[RunStart | None] = []

    async def __call__(
        self,
        _runtime: Runtime,
        run: Run,
        _reason: Callable[[], str | None],
        _job: int,
        /,
        *,
        unsteered: bool = False,
        start: RunStart | None = None,
    ) -> bool:
        self.runs.append(run)
        self.starts.append(start)
        return False


class Reserved:
    """This process's handoff as an ask sees it, with room under `worker_id`; it starts
    nothing (the test does, or no one: a process that died)."""

    def __init__(self, worker_id: int, lease: int | None = None) -> None:
        self.worker_id = worker_id
        self.lease = lease  # None: the ask commits its run queued
        self.offered: list[tuple[str, int | None, bool]] = []
        self.started: list[FirstStart | None] = []

    def reserve(self) -> int | None:
        return self.worker_id

    def release(self) -> None:
        pass

    def offer(
        self,
        run_id: str,
        job_id: int | None,
        claimed: bool = False,
        followed: dict[str, Any] | None = None,
        newest: Newest | None = None,
        started: FirstStart | None = None,
    ) -> None:
        self.offered.append((run_id, job_id, claimed))
        self.started.append(started)


async def register_worker(engine: AsyncEngine, heartbeat_age_seconds: float = 0) -> int:
    async with engine.begin() as conn:
        query = text(
            "INSERT INTO procrastinate_workers (last_heartbeat)"
            " VALUES (now() - make_interval(secs => :age)) RETURNING id"
        )
        return int((await conn.execute(query, {"age": heartbeat_age_seconds})).scalar_one())


async def job_row(engine: AsyncEngine, job_id: int | None) -> Any:
    async with engine.connect() as conn:
        query = text(
            "SELECT status, worker_id, attempts, abort_requested,"
            " (SELECT count(*) FROM procrastinate_events e WHERE e.job_id = j.id) AS events"
            " FROM procrastinate_jobs j WHERE id = :id"
        )
        return (await conn.execute(query, {"id": job_id})).one()


async def test_serve_commits_each_ask_with_its_job_taken_by_its_handoff(
    handoff_settings: tuple[Settings, str], upstream: FakeUpstream
) -> None:
    """One ask at a time, with room: each job is committed taken by the handoff's worker, and
    procrastinate's worker never handles it (no event of its own: not deferred, not started)."""
    settings, key = handoff_settings
    upstream.clear()
    asks_made = 3
    for i in range(asks_made):
        upstream.script(Text(f"answer {i}"), Usage(3, 2))
    app: FastAPI = create_app(settings, workers=2)
    server, thread, url = serve_in_thread(app)
    engine = create_engine(settings)
    try:
        headers = {"Authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as api:
            runs = []
            for _ in range(asks_made):
                sid = (await new_session(api))["id"]
                events = await collect(api, "POST", f"/v1/sessions/{sid}/ask", json={"input": "q"})
                types = [e.type for e in events]
                # started by the ask's commit: once, as its first attempt
                assert types[:3] == ["run.created", "run.started", "message.delta"], types
                assert types[-1] == "run.completed" and "message.reset" not in types
                assert [e.id for e in events] == list(range(1, len(events) + 1))
                assert events[1].data == {"attempt": 1}
                runs.append(events[0].data["run_id"])
        handoff = app.state.handoff
        assert isinstance(handoff, Handoff) and handoff.claimed == asks_made
        async with engine.connect() as conn:
            stored = [await runs_db.get_run(conn, run_id) for run_id in runs]
        for run in stored:
            assert run is not None and (run.status, run.attempts) == (RunStatus.COMPLETED, 1)
            job = await job_row(engine, run.job_id)
            # status events only: procrastinate writes one when its worker defers or takes
            # a job ('deferred', 'started'); the handoff's finish writes the end's
            assert (job.status, job.events) == ("succeeded", 1)
    finally:
        stop_thread_server(server, thread)
        await engine.dispose()
        upstream.clear()


async def test_a_cancel_holding_a_claimed_runs_row_ends_it_before_it_starts(
    handoff_settings: tuple[Settings, str],
) -> None:
    """A job committed taken by the handoff cannot be left to the queue: the handoff waits for
    a cancel that holds the run's row (it holds no job lock that the cancel would wait for:
    no deadlock), then ends the cancelled run instead of starting it, and its job."""
    settings, key = handoff_settings
    engine = create_engine(settings)
    try:
        tenant, session = await tenant_session(engine, key)
        worker_id = await register_worker(engine)
        asked = await asks.ask(
            engine,
            settings,
            tenant,
            session.id,
            asks.AskParams("q"),
            handoff=Reserved(worker_id),
        )
        assert asked.claimed and asked.run.job_id is not None
        run_id, job_id = asked.run.id, asked.run.job_id
        runtime = runtime_of(engine, settings)
        execute = Executed()
        executed = execute.runs

        handoff = Handoff(runtime, [worker_id], 1, start_locked, execute)
        async with engine.connect() as canceller:
            await canceller.begin()
            run = await runs_db.get_run(canceller, run_id, lock=True)  # the cancel's first lock
            assert run is not None
            handoff.offer(run_id, job_id, claimed=True)
            await wait_for_lock_wait(engine, "FOR UPDATE")  # the handoff waits for the run
            await run_transitions.request_cancel(canceller, run, "cancel")  # then the job's lock
            await canceller.commit()
        await handoff.close(grace_seconds=60)
        assert executed == [] and handoff.claimed == 1
        async with engine.connect() as conn:
            ended = await runs_db.get_run(conn, run_id)
        assert ended is not None and ended.status is RunStatus.CANCELLED
        job = await job_row(engine, job_id)
        assert (job.status, job.abort_requested) == ("succeeded", False)
    finally:
        await engine.dispose()


@pytest.mark.parametrize("started", [False, True])
async def test_a_claimed_job_whose_process_died_before_its_run_started_goes_back_to_the_queue(
    handoff_settings: tuple[Settings, str], upstream: FakeUpstream, started: bool
) -> None:
    """The ask committed its job taken by a process that died (kill -9) before its handoff
    executed the run: the job is 'doing' under a worker that never beats again. Another
    process's stalled-job check gives it back to the queue, and its worker runs it. `started`:
    the ask's commit started the run too, under the dead process's lease (held by no one):
    that attempt counts as the dead worker's, and the run is taken over (recovered) as any
    run whose worker died."""
    settings, key = handoff_settings
    upstream.clear()
    upstream.script(Text("the answer"), Usage(3, 2))
    engine = create_engine(settings)
    server = thread = None
    try:
        tenant, session = await tenant_session(engine, key)
        # The dead process's registration: its last heartbeat long past the stall threshold.
        dead = await register_worker(engine, settings.stalled_after_seconds * 100)
        dead_lease = 2**40 + secrets.randbelow(2**40) if started else None
        asked = await asks.ask(
            engine,
            settings,
            tenant,
            session.id,
            asks.AskParams("q"),
            Limits(),  # none: its commit is one statement (app/services/asks._commit_unlocked)
            handoff=Reserved(dead, lease=dead_lease),
        )
        assert asked.claimed and (asked.started is not None) == started
        assert (await job_row(engine, asked.run.job_id)).status == "doing"
        app: FastAPI = create_app(settings, workers=2)
        server, thread, url = serve_in_thread(app)
        headers = {"Authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=90) as api:
            done = (
                await api.get(f"/v1/runs/{asked.run.id}", params={"wait": "true", "timeout": 60})
            ).json()
        assert done["status"] == "completed" and done["result"] == "the answer", done
        assert len(upstream.requests) == 1
        if started:  # the dead worker's attempt, then the one that ran it
            assert done["attempts"] == 2
            return
        assert done["attempts"] == 1  # never started before: no worker was lost
        # A job the worker fetched is finished by procrastinate after the task returns: just
        # after the run's end commits, not with it.
        deadline = asyncio.get_running_loop().time() + 60
        while (job := await job_row(engine, asked.run.job_id)).status == "doing":
            assert asyncio.get_running_loop().time() < deadline, "the job never finished"
            await asyncio.sleep(0.05)
        assert (job.status, job.attempts) == ("succeeded", 2)  # retried once, then run
        assert len(upstream.requests) == 1
    finally:
        if server is not None and thread is not None:
            stop_thread_server(server, thread)
        await engine.dispose()
        upstream.clear()


async def test_an_ask_whose_worker_registration_was_pruned_is_queued_not_refused(
    handoff_settings: tuple[Settings, str],
) -> None:
    """The process's worker registration was pruned between its checks (after a database
    outage): the job it would have committed taken breaks the registration's foreign key. The
    ask is still accepted, its job queued for whichever worker fetches it."""
    settings, key = handoff_settings
    engine = create_engine(settings)
    try:
        tenant, session = await tenant_session(engine, key)
        pruned = await register_worker(engine)
        async with engine.begin() as conn:
            await conn.execute(
                text("DELETE FROM procrastinate_workers WHERE id = :id"), {"id": pruned}
            )
        reserved = Reserved(pruned)
        asked = await asks.ask(
            engine, settings, tenant, session.id, asks.AskParams("q"), handoff=reserved
        )
        assert asked.created and not asked.claimed and asked.run.job_id is not None
        # offered all the same: the handoff claims it as the queue's worker would, if it can
        assert reserved.offered == [(asked.run.id, asked.run.job_id, False)]
        job = await job_row(engine, asked.run.job_id)
        assert job.status == "todo"
        async with engine.connect() as conn:
            kinds = await conn.scalars(
                text("SELECT kind FROM entries WHERE session_id = :id ORDER BY seq"),
                {"id": session.id},
            )
            assert list(kinds) == ["message", "run_start"]  # committed once, whole
    finally:
        await engine.dispose()


async def wait_for_lock_wait(engine: AsyncEngine, query_part: str) -> None:
    """Until a session waits for a row lock in a query containing `query_part` (a connection
    per look: the pool is small, and the waiter needs one of its own)."""
    for _ in range(600):
        async with engine.connect() as conn:
            waiting = await conn.scalar(
                text(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE wait_event_type = 'Lock' AND position(:part IN query) > 0"
                ),
                {"part": query_part},
            )
        if waiting:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"no query with {query_part!r} ever waited for a lock")


async def long_conversation(engine: AsyncEngine, key: str) -> tuple[str, str, int]:
    """A session of 300 messages (more than a run's start reads of a thread), its tenant's and
    a registered worker's ids: (tenant, session, worker)."""
    tenant, session = await tenant_session(engine, key)
    earlier = [
        NewEntry(EntryKind.MESSAGE, {"role": role, "content": f"{role} {i}"}, {})
        for i in range(150)
        for role in ("user", "assistant")
    ]
    async with engine.begin() as conn:
        await append_in(conn, tenant, session.id, earlier)
    return tenant, session.id, await register_worker(engine)


async def asked_claimed(
    engine: AsyncEngine, settings: Settings, tenant: str, session_id: str, worker_id: int
) -> asks.AskResult:
    """An ask of the session, its job committed taken by `worker_id` (nothing starts it)."""
    params = asks.AskParams("and now?")
    reserved = Reserved(worker_id)
    asked = await asks.ask(engine, settings, tenant, session_id, params, Limits(), handoff=reserved)
    assert asked.claimed and asked.run.job_id is not None
    return asked


@pytest.mark.parametrize("appended_meanwhile", [False, True])
async def test_a_claimed_runs_first_step_projects_from_the_thread_its_ask_read(
    handoff_settings: tuple[Settings, str], appended_meanwhile: bool
) -> None:
    """A long conversation: the ask read its whole thread to project it (more than the newest
    entries a start reads), and hands it, its own entries appended, to the run it starts here:
    the run's first step projects from that (no read of the thread, no snapshot) when the
    session is still at the ask's rev, which makes them the same entries as stored; an entry
    appended meanwhile leaves the run to what its start read."""
    settings, key = handoff_settings
    engine = create_engine(settings)
    try:
        tenant, session_id, worker_id = await long_conversation(engine, key)
        asked = await asked_claimed(engine, settings, tenant, session_id, worker_id)
        assert asked.newest is not None
        if appended_meanwhile:
            note = NewEntry(EntryKind.MESSAGE, {"role": "user", "content": "meanwhile"}, {})
            async with engine.begin() as conn:
                await append_in(conn, tenant, session_id, [note])
        async with engine.connect() as conn:
            stored = await journal_db.read_entries(conn, [Segment(session_id, 0, None)], limit=1000)
        thread = [journal_db.journal_entry(r) for r in stored]
        assert asked.newest.reaches_start and asked.newest.entries == thread[:302]

        execute = Executed()
        runtime = runtime_of(engine, settings)
        handoff = Handoff(runtime, [worker_id], 1, start_locked, execute, start_first)
        handoff.offer(asked.run.id, asked.run.job_id, claimed=True, newest=asked.newest)
        await handoff.close(grace_seconds=60)
        (start,) = execute.starts
        assert start is not None and start.newest is not None
        if appended_meanwhile:
            assert start.newest is not asked.newest
            assert start.newest.entries == thread[-NEWEST_ENTRIES:]
        else:
            assert start.newest is asked.newest
    finally:
        await engine.dispose()


async def test_the_thread_an_ask_hands_its_run_is_let_go_once_its_first_step_projected_it(
    handoff_settings: tuple[Settings, str], upstream: FakeUpstream
) -> None:
    """A long conversation's thread, handed by the ask to its run, is held until the run's
    first step projected it, not for the run's life (runs at once times whole threads)."""
    settings, key = handoff_settings
    engine = create_engine(settings)
    release = threading.Event()
    try:
        tenant, session_id, worker_id = await long_conversation(engine, key)
        asked = await asked_claimed(engine, settings, tenant, session_id, worker_id)
        assert asked.newest is not None and asked.run.job_id is not None
        thread = weakref.ref(asked.newest)
        run_id, job_id, newest = asked.run.id, asked.run.job_id, asked.newest
        del asked
        arrived = asyncio.Event()
        loop = asyncio.get_running_loop()

        def respond(request: ReceivedRequest) -> Script:
            # (picked by its question: another test's run may still call the shared fake)
            if request.body["messages"][-1]["content"] != "and now?":
                return DEFAULT_SCRIPT
            loop.call_soon_threadsafe(arrived.set)
            return Script((Text("Hel"), Hold(release), Text("lo")))

        upstream.clear()
        upstream.respond_with(respond)
        runtime = runtime_of(engine, settings)
        handoff = Handoff(runtime, [worker_id], 1, start_locked, execute_started, start_first)
        handoff.offer(run_id, job_id, claimed=True, newest=newest)
        del newest
        await asyncio.wait_for(arrived.wait(), 60)  # the first step projected, called the model
        (sent,) = [
            r.body["messages"]
            for r in upstream.requests
            if r.body["messages"][-1]["content"] == "and now?"
        ]
        assert len(sent) == 301  # the whole thread, and the question
        gc.collect()
        assert thread() is None  # while the run still streams
        release.set()
        await handoff.close(grace_seconds=60)
        async with engine.connect() as conn:
            ended = await runs_db.get_run(conn, run_id)
        assert ended is not None and ended.status is RunStatus.COMPLETED
    finally:
        release.set()
        upstream.respond_with(None)
        await engine.dispose()


async def test_a_run_its_ask_committed_started_is_executed_as_it_is(
    handoff_settings: tuple[Settings, str],
) -> None:
    """The ask's commit started the run under the handoff's lease: the handoff executes it with
    what the ask handed it (the started run, its start's read, no steer pending), writing
    nothing to start it (the job's end is its only statement here); its start event is told
    to this process's followers with the ask's first event."""
    settings, key = handoff_settings
    engine = create_engine(settings)
    try:
        tenant, session = await tenant_session(engine, key)
        worker_id = await register_worker(engine)
        told = Told()
        writer = EventWriter(engine, followers=told)
        runtime = Runtime(engine, settings, Router(settings), writer, WorkerLease(engine))
        params = asks.AskParams("q")
        reserved = Reserved(worker_id, lease=runtime.lease.key)
        asked = await asks.ask(
            engine, settings, tenant, session.id, params, Limits(), handoff=reserved
        )
        started = asked.started
        assert asked.claimed and started is not None and asked.first_event is not None

        execute = Executed()
        starts: list[str] = []

        async def start_first_counted(runtime: Runtime, run_id: str) -> FirstStart | None:
            starts.append(run_id)
            return await start_first(runtime, run_id)

        handoff = Handoff(runtime, [worker_id], 1, start_locked, execute, start_first_counted)
        with watching(engine) as seen:
            handoff.offer(
                asked.run.id,
                asked.run.job_id,
                claimed=True,
                followed=asked.first_event,
                newest=asked.newest,
                started=started,
            )
            await handoff.close(grace_seconds=60)
        assert starts == [] and execute.runs == [started.run]
        assert execute.starts == [started.start]
        assert started.run.status is RunStatus.RUNNING and started.run.attempts == 1
        assert len(seen.statements) == 1 and "procrastinate_finish_job" in seen.statements[0]
        assert told.expected == [asked.first_event]
        assert [(r["seq"], r["type"], r["data"]) for r in told.published] == [
            (2, "run.started", {"attempt": 1})
        ]
    finally:
        await engine.dispose()
