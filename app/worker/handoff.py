"""In-process handoff: the process that committed an ask starts its run at once.

`threadline serve` runs the API and workers in one process; an ask's run need not wait for
procrastinate's worker to hear of its job and fetch it (one job at a time): the ask hands it
over here. Its procrastinate job stays the durable record and the crash backup. Exactly one
worker runs it: the handoff claims the job itself, as procrastinate's fetch does (todo -> doing
under this process's worker id, only if no job of the same session lock is running or queued
before it), and a job that procrastinate's worker took first is left to it. The claim and the
run's start are one transaction. It takes the job's row first (so that it claims as soon as
procrastinate's worker would), then the run's without waiting: a cancel locks the run's row,
then waits for the job's, so a run found locked is left to the queue (the claim rolled back)
rather than risk a deadlock. A started run is then executed and fenced like any other (its
lease, its attempt); if this process dies, the lease goes with it and another worker resumes
the run from the journal (app/worker/pool.py).

Better still, an ask that finds room here reserves it (`reserve`) and commits its job already
taken by this process's worker, when its session's queue lets it (app/db/jobs.py): the handoff
then starts the run with no claim of its own, and procrastinate's worker never hears of it.
Such a job cannot be left to the queue: its run is started, or its job ends failed (the run is
then queued again by the run recovery); if this process dies first, procrastinate's stalled-job
check gives the job back to the queue, as for any job its worker held.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core.runs import Run
from app.db import jobs as jobs_db
from app.db import runs as runs_db
from app.db.outage import retrying
from app.db.runs import FirstStart
from app.db.sessions import Newest, RunStart
from app.eventlog.store import numbered
from app.runs import machine
from app.worker.runtime import Runtime

log = logging.getLogger(__name__)
ABORT_CHECK_SECONDS = 0.5

# procrastinate_fetch_job_v2's choice, for one given job: still todo, and first of its lock.
_CLAIM = text(
    "UPDATE procrastinate_jobs SET status = 'doing', worker_id = :worker_id"
    " WHERE id = (SELECT jobs.id FROM procrastinate_jobs AS jobs"
    "  WHERE jobs.id = :job_id AND jobs.status = 'todo'"
    "  AND (jobs.scheduled_at IS NULL OR jobs.scheduled_at <= now())"
    "  AND NOT EXISTS (SELECT 1 FROM procrastinate_jobs AS other_jobs"
    "   WHERE jobs.lock IS NOT NULL AND other_jobs.lock = jobs.lock AND ("
    "    other_jobs.status = 'doing' OR (other_jobs.status = 'todo' AND ("
    "     other_jobs.priority > jobs.priority"
    "     OR (other_jobs.priority = jobs.priority AND other_jobs.id < jobs.id)))))"
    "  FOR UPDATE OF jobs SKIP LOCKED)"
    " RETURNING id"
)
_ABORTS = text(
    "SELECT id FROM procrastinate_jobs"
    " WHERE id = ANY(CAST(:ids AS bigint[])) AND status = 'doing' AND abort_requested"
)
# What the handoff calls (app/worker/run.py): start a run whose row is locked, in the
# transaction that claims its job; start a run never started in one statement (None: not
# such a run); execute the started run, finishing its job (given) with the run's end if it
# can (True if it did).
Start = Callable[[AsyncConnection, Runtime, Run | None], Awaitable[Run | None]]
StartFirst = Callable[[Runtime, str], Awaitable[FirstStart | None]]


class Execute(Protocol):
    def __call__(
        self,
        runtime: Runtime,
        run: Run,
        abort_reason: Callable[[], str | None],
        job_id: int,
        /,
        *,
        unsteered: bool = False,
        start: RunStart | None = None,
    ) -> Awaitable[bool]: ...


class _LeftToQueue(Exception):
    """The handoff's claim is rolled back: the queue's worker takes the job as usual."""


class Handoff:
    """Runs handed over by this process's asks, up to `limit` at once (beyond it, or before
    the worker is registered, the queue's worker takes them as usual)."""

    def __init__(
        self,
        runtime: Runtime,
        worker_ids: list[int],
        limit: int,
        start: Start,
        execute: Execute,
        start_first: StartFirst | None = None,
    ) -> None:
        self._runtime = runtime
        self._worker_ids = worker_ids  # procrastinate's registrations of this process
        self._limit = limit
        self._start = start
        self._start_first = start_first
        self._execute = execute
        self._running: dict[int, asyncio.Task[None]] = {}  # by job id
        self._reserved = 0  # asks being committed with their job taken for this handoff
        self._aborted: set[int] = set()
        self._closed = False
        self.claimed = 0  # runs this handoff executed (for tests)

    @property
    def lease(self) -> int | None:
        """The lease the runs it executes are started under (its runtime's)."""
        return self._runtime.lease.key

    def reserve(self) -> int | None:
        """Room for one more run, held until `offer` or `release`: the worker id the ask's job
        may be committed taken by; None: no room (the ask's job is deferred as usual)."""
        if self._closed or not self._worker_ids:
            return None
        if len(self._running) + self._reserved >= self._limit:
            return None
        self._reserved += 1
        return self._worker_ids[-1]

    def release(self) -> None:
        """Give back a reservation (the ask is committed, or failed): call before `offer`."""
        self._reserved -= 1

    def offer(
        self,
        run_id: str,
        job_id: int | None,
        claimed: bool = False,
        followed: dict[str, Any] | None = None,
        newest: Newest | None = None,
        started: FirstStart | None = None,
    ) -> None:
        """Start the run now if this process has room; never waits, never fails the ask.
        `claimed`: its job was committed taken by this handoff's worker (`reserve`): the run
        is started, or its job ended. `followed`: its first event, for a stream of this
        process about to follow it: told to this process's followers before the run starts,
        when it runs here (claimed). `newest`: the thread's newest entries as the ask read
        them (RunStart.with_newest), for the start of a run that runs here (claimed).
        `started`: the run, started by the ask's commit (claimed): executed as it is, its
        start event told to this process's followers at once."""
        if claimed and job_id is not None:
            if followed is not None:
                self._runtime.writer.expect(followed)
            if started is not None:
                ((kind, data),) = machine.first_start().events
                rows = [(run_id, kind, data)]
                self._runtime.writer.publish(numbered(rows, {run_id: started.event_seq}))
            self._start_task(run_id, job_id, claimed=True, newest=newest, started=started)
            return
        if self._closed or job_id is None or not self._worker_ids:
            return
        if len(self._running) >= self._limit:
            return
        self._start_task(run_id, job_id, claimed=False)

    def _start_task(
        self,
        run_id: str,
        job_id: int,
        claimed: bool,
        newest: Newest | None = None,
        started: FirstStart | None = None,
    ) -> None:
        # Shutting down (a claimed job): it ends failed, and the run recovery queues the run.
        run = (
            self._finish(job_id, "failed")
            if self._closed
            else self._run(run_id, job_id, claimed, newest, started)
        )
        task = asyncio.create_task(run, name=f"handoff {run_id}")
        self._running[job_id] = task
        task.add_done_callback(lambda _t: self._running.pop(job_id, None))

    async def _run(
        self,
        run_id: str,
        job_id: int,
        claimed: bool,
        newest: Newest | None = None,
        asked: FirstStart | None = None,
    ) -> None:
        unsteered = False  # its start found no steer pending
        read: RunStart | None = None  # what its start read of its session
        try:
            # A claimed job's run, never started: one statement starts it (the common case),
            # unless the ask's commit did.
            first = asked
            del asked  # `first` is let go of below, with what it holds
            if first is None and claimed and self._start_first is not None:
                first = await self._start_first(self._runtime, run_id)
            if first is not None:
                started: Run | None = first.run
                unsteered, read = not first.steered, first.start.with_newest(newest)
            else:
                started = await self._start_locked(run_id, job_id, claimed)
        except _LeftToQueue:
            return
        except asyncio.CancelledError:
            if claimed:  # shut down before the run started: it is queued again
                await asyncio.shield(self._finish(job_id, "failed"))
            raise
        except Exception:
            if claimed:
                log.warning("starting run %s failed; it is queued again", run_id, exc_info=True)
                await asyncio.shield(self._finish(job_id, "failed"))
            else:
                log.warning("handing run %s over failed; the queue runs it", run_id, exc_info=True)
            return
        self.claimed += 1
        status = "failed"
        finished = False  # the job, with the run's end
        try:
            if started is not None:  # else: over already, or cancelled before it started
                running = self._execute(
                    self._runtime,
                    started,
                    lambda: self._reason(job_id),
                    job_id,
                    unsteered=unsteered,
                    start=read,
                )
                # What its start read (and the thread its ask read) is the run's first step's
                # to let go of, not held here for the run's life.
                read = newest = first = None
                finished = await running
            status = "succeeded"
        except asyncio.CancelledError:
            # Shutting down: the job ends failed, so another worker resumes the run
            # (app/worker/pool.py requeues a run whose job ended without ending it).
            status = "failed"
            raise
        except Exception:
            log.exception("run %s failed in its handoff", run_id)
        finally:
            self._aborted.discard(job_id)
            if not finished:
                await asyncio.shield(self._finish(job_id, status))

    async def _start_locked(self, run_id: str, job_id: int, claimed: bool) -> Run | None:
        """Start the run under its row's lock, claiming its job first unless the ask committed
        it claimed; _LeftToQueue when the queue's worker is to take it after all."""
        async with self._runtime.engine.begin() as conn:
            if claimed:
                # No job lock held here: waiting for a cancel's lock on the run is safe.
                run = await runs_db.get_run(conn, run_id, lock=True)
            else:
                worker_id = self._worker_ids[-1]
                params = {"job_id": job_id, "worker_id": worker_id}
                if (await conn.execute(_CLAIM, params)).scalar() is None:
                    # the queue's worker took it, or its session has another job first
                    raise _LeftToQueue
                run = await runs_db.get_run(conn, run_id, lock=True, skip_locked=True)
                if run is None:  # being cancelled (or gone): the claim is undone
                    raise _LeftToQueue
            return await self._start(conn, self._runtime, run)

    async def _finish(self, job_id: int, status: str) -> None:
        async def finish() -> None:
            async with self._runtime.engine.begin() as conn:
                await jobs_db.finish_job(conn, job_id, status)

        try:
            await retrying(finish)
        except Exception:  # the run's recovery ends it, if this process cannot
            log.exception("finishing job %s failed", job_id)

    def _reason(self, job_id: int) -> str | None:
        return "user_request" if job_id in self._aborted else None

    async def watch_aborts(self) -> None:
        """Cancel the runs whose job was asked to abort (a user's cancel), as procrastinate's
        worker does for the jobs it runs."""
        while True:
            await asyncio.sleep(ABORT_CHECK_SECONDS)
            if not self._running:
                continue
            try:
                async with self._runtime.engine.connect() as conn:
                    ids = list(self._running)
                    aborted = (await conn.execute(_ABORTS, {"ids": ids})).scalars().all()
            except Exception:
                log.warning("checking handed-over runs for cancels failed", exc_info=True)
                continue
            for job_id in aborted:
                task = self._running.get(int(job_id))
                if task is not None and int(job_id) not in self._aborted:
                    self._aborted.add(int(job_id))
                    task.cancel()

    async def close(self, grace_seconds: float) -> None:
        """Stop taking runs; let those running finish for `grace_seconds`, then cancel them
        (their jobs end failed: the runs resume on another worker, or at the next start)."""
        self._closed = True
        tasks = list(self._running.values())
        if tasks and grace_seconds > 0:
            await asyncio.wait(tasks, timeout=grace_seconds)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
