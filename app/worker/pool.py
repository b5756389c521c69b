"""The worker pool: procrastinate's worker running runs, completion webhook deliveries and the
retention job, plus the event writer and the retry of stalled jobs (a worker that died: its
heartbeat stopped)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator

import croniter
import procrastinate
from procrastinate import JobContext
from sqlalchemy.ext.asyncio import AsyncEngine

from app.config import Settings
from app.db import jobs as jobs_db
from app.db import runs as runs_db
from app.db.engine import create_direct_engine, create_engine, libpq_url
from app.db.jobs import (
    MAINTENANCE_QUEUE,
    RETENTION_TASK,
    RUN_QUEUE,
    RUN_TASK,
    SCHEDULE_TASK,
    WEBHOOK_QUEUE,
    WEBHOOK_TASK,
)
from app.eventlog.writer import EventWriter, LocalFollowers
from app.llm.router import Router
from app.llm.tokenizers import stored_counter
from app.services import retention, run_transitions, schedules
from app.services.approvals import expire_approvals
from app.services.runs import expire_waiting_runs
from app.tools.webhook import aclose_shared_client
from app.worker import runtime as runtimes
from app.worker.handoff import Handoff
from app.worker.lease import WorkerLease
from app.worker.registration import keep_registered, work_queues
from app.worker.run import execute_run, execute_started, start_first, start_locked
from app.worker.webhooks import deliver

log = logging.getLogger(__name__)


def queue_pool_size(concurrency: int) -> int:
    """The most connections procrastinate's pool opens in a worker running `concurrency` runs at
    once. It serves job fetches, finishes, heartbeats and LISTEN: psycopg_pool's default of 4
    starves a worker running many runs at once."""
    return max(4, min(concurrency // 4 + 4, 32))


def queue_app(settings: Settings, runtime: runtimes.Runtime, concurrency: int) -> procrastinate.App:
    """A procrastinate app whose `concurrency` workers execute runs with `runtime`.

    It connects directly (direct_database_url): procrastinate LISTENs for new jobs, and psycopg
    prepares statements it runs often, neither of which survives a transaction pooler."""
    connector = procrastinate.PsycopgConnector(
        conninfo=libpq_url(settings.direct_url), min_size=2, max_size=queue_pool_size(concurrency)
    )
    app = procrastinate.App(connector=connector)

    # The task is registered on each app with its pool's runtime, not through a module-level
    # Blueprint and a process-wide runtime: procrastinate renames a blueprint's tasks in place
    # when it is added, so a second pool in the same process (tests, embedding) knew only
    # "threadline:threadline:run_ask", and the pools shared one runtime (engine, event loop).
    @app.task(name=RUN_TASK, queue=RUN_QUEUE, pass_context=True)
    async def run_ask(context: JobContext, run_id: str) -> None:
        def abort_reason() -> str | None:
            reason = context.abort_reason()
            return reason.value if reason is not None else None

        await execute_run(runtime, run_id, abort_reason)

    # Attempts are counted on the delivery row, which gives up after the last one: the strategy
    # only spaces them out (its own limit is a backstop).
    backoff = procrastinate.RetryStrategy(
        max_attempts=settings.run_webhook_max_attempts,
        exponential_wait=settings.run_webhook_backoff_seconds,
    )

    @app.task(name=WEBHOOK_TASK, queue=WEBHOOK_QUEUE, retry=backoff)
    async def deliver_webhook(delivery_id: str) -> None:
        await deliver(runtime.engine, settings, delivery_id)

    # Queued by _schedule_retention at each tick; the queueing lock keeps one waiting at a time
    # when a purge outlasts a tick or several workers queue it.
    @app.task(name=RETENTION_TASK, queue=MAINTENANCE_QUEUE, queueing_lock=RETENTION_TASK)
    async def purge(timestamp: int) -> None:
        await retention.purge(
            runtime.engine,
            event_retention_seconds=settings.event_retention_seconds,
            batch_size=settings.retention_batch_size,
        )

    # Queued by _tick_schedules; a firing is claimed in Postgres (app/services/schedules.py),
    # so two of these running at once fire each due time once all the same.
    @app.task(name=SCHEDULE_TASK, queue=MAINTENANCE_QUEUE, queueing_lock=SCHEDULE_TASK)
    async def fire_schedules(timestamp: int) -> None:
        await schedules.fire_due(runtime.engine, settings)

    return app


@contextlib.asynccontextmanager
async def worker_pool(
    settings: Settings,
    concurrency: int,
    engine: AsyncEngine | None = None,
    followers: LocalFollowers | None = None,
) -> AsyncIterator[Handoff]:
    """Run `concurrency` run-executing workers in this process until the block exits; with
    `engine` (`threadline serve`: the API's), on its pool rather than one of their own, so that
    one process holds one pool of database connections; `followers` are handed the run events
    they commit (serve: its event hub). Yields the handoff
    through which this process's asks start their runs at once (app/worker/handoff.py)."""
    own_engine = engine is None
    if engine is None:
        engine = create_engine(settings)
    await asyncio.to_thread(stored_counter)  # load the vocabulary now, not on the first ask
    router = Router(settings)
    await asyncio.to_thread(router.import_providers)
    writer = EventWriter(engine, settings.event_tick_seconds, followers)
    # The lease's lock lives as long as its connection: one of its own, never a pooled one (the
    # pool's would be out of the pool for good) nor one through a transaction pooler (which
    # hands the server connection, and the lock with it, to other clients between transactions).
    lease_engine = create_direct_engine(settings)
    lease = WorkerLease(lease_engine)
    await lease.acquire()
    runtime = runtimes.Runtime(engine, settings, router, writer, lease)
    app = queue_app(settings, runtime, concurrency)
    registered = keep_registered(app, engine)
    # Only asks are handed over (app/services/asks.py): their runs need no compaction check.
    handoff = Handoff(runtime, registered, concurrency, start_locked, execute_started, start_first)
    async with app.open_async():
        background = [
            asyncio.create_task(writer.run(), name="event-writer"),
            asyncio.create_task(lease.keep(), name="worker-lease"),
            asyncio.create_task(_recover_runs(runtime), name="run-recovery"),
            asyncio.create_task(_retry_stalled(app, runtime, registered), name="stalled-jobs"),
            asyncio.create_task(handoff.watch_aborts(), name="handoff-aborts"),
            asyncio.create_task(_schedule_retention(app, settings), name="retention-schedule"),
            asyncio.create_task(_tick_schedules(app, settings), name="schedule-ticks"),
            asyncio.create_task(warm_local_model(router, settings), name="local-model-warmup"),
            asyncio.create_task(
                work_queues(
                    lambda: app.run_worker_async(
                        queues=[RUN_QUEUE, WEBHOOK_QUEUE, MAINTENANCE_QUEUE],
                        concurrency=concurrency,
                        install_signal_handlers=False,
                        update_heartbeat_interval=settings.worker_heartbeat_seconds,
                        shutdown_graceful_timeout=settings.worker_shutdown_seconds,
                    ),
                    settings.stall_check_seconds,
                ),
                name="procrastinate-worker",
            ),
        ]
        try:
            yield handoff
        finally:
            await handoff.close(settings.worker_shutdown_seconds)
            for task in reversed(background):
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
            # Summaries still being written for asks that stopped waiting: lost, not harmful
            # (nothing was committed; a later ask compacts again).
            for pending in list(runtime.compactions.values()):
                pending.task.cancel()
                with contextlib.suppress(BaseException):
                    await pending.task
            with contextlib.suppress(Exception):
                await writer.flush()
            await lease.release()
            await lease_engine.dispose()
            await aclose_shared_client()
            if own_engine:
                await engine.dispose()


# How often the warm-up looks again for the local model's packages (`make run` installs them
# in the background while the service runs).
LOCAL_PACKAGES_POLL_SECONDS = 5.0


async def warm_local_model(router: Router, settings: Settings) -> None:
    """Load the local model in the background when it answers by default: the first ask after a
    start waited for it, silently (34 s once, on a cold disk cache). An ask meanwhile waits for
    the load as before. Packages still being installed are waited for."""
    if not settings.default_model.startswith("local:"):
        return
    from app.llm.base import ProviderError
    from app.llm.local_provider import LocalProvider, packages_installed

    provider, _ = router.provider_for(settings.default_model)
    if not isinstance(provider, LocalProvider):  # a test's router serves local:* otherwise
        return
    told = False
    # Polled: a package appearing on disk sends no event.
    bundled = settings.local_model_path is None
    while not await asyncio.to_thread(packages_installed, bundled):
        if not told:
            log.info("the local model waits for llama-cpp-python to be installed")
            told = True
        await asyncio.sleep(LOCAL_PACKAGES_POLL_SECONDS)
    log.info("loading the local model (%s)…", settings.default_model)
    started = time.monotonic()
    try:
        await asyncio.to_thread(provider.warm)
    except ProviderError as exc:
        log.warning("the local model is unavailable: %s", exc.message)
        return
    except Exception:  # the first ask reports it as it fails; the service goes on
        log.exception("loading the local model failed")
        return
    log.info("the local model is ready (%.1f s)", time.monotonic() - started)


async def _recover_runs(runtime: runtimes.Runtime) -> None:
    """Every tick, queue again the runs nobody will finish: their worker died (its lease is
    gone: a kill is seen within a tick) or their job ended without ending them (a database
    outage outlasted the worker's retries). They resume from the journal."""
    while True:
        await asyncio.sleep(runtime.settings.recovery_check_seconds)
        try:
            await recover_orphaned_runs(runtime.engine)
        except Exception:
            log.exception("looking for runs to recover failed")


async def recover_orphaned_runs(
    engine: AsyncEngine, lease_grace_seconds: float = runs_db.LEASE_GRACE_SECONDS
) -> list[str]:
    """One pass of the run recovery, in one transaction; returns the ids of the runs it
    queued again or ended (those cancelled meanwhile)."""
    async with engine.begin() as conn:
        orphans = await runs_db.orphaned_runs(conn, lease_grace_seconds)
        for orphan in orphans:
            log.warning("run %s has nobody to finish it: queued again", orphan.run.id)
            await run_transitions.recover(conn, orphan)
    return [orphan.run.id for orphan in orphans]


async def _schedule_retention(app: procrastinate.App, settings: Settings) -> None:
    """Queue the retention job at each tick of THREADLINE_RETENTION_CRON. Not procrastinate's
    periodic deferrer: when the database is unreachable at a tick, that one stops the whole
    worker, runs and all; this loop logs it and queues at the next tick."""
    ticks = croniter.croniter(settings.retention_cron, time.time())
    while True:
        tick = ticks.get_next(float)
        await asyncio.sleep(max(0.0, tick - time.time()))
        try:
            await app.configure_task(RETENTION_TASK).defer_async(timestamp=int(tick))
        except procrastinate.exceptions.AlreadyEnqueued:
            pass  # the last tick's purge is still waiting: it covers this one
        except Exception:
            log.exception("queueing the retention job failed")


async def _tick_schedules(app: procrastinate.App, settings: Settings) -> None:
    """Queue a firing of the due schedules every THREADLINE_SCHEDULE_TICK_SECONDS (a loop like
    _schedule_retention's, for the same reason)."""
    while True:
        await asyncio.sleep(settings.schedule_tick_seconds)
        try:
            await app.configure_task(SCHEDULE_TASK).defer_async(timestamp=int(time.time()))
        except procrastinate.exceptions.AlreadyEnqueued:
            pass  # a firing is waiting to run: it covers this tick
        except Exception:
            log.exception("queueing the schedules' firing failed")


async def _retry_stalled(
    app: procrastinate.App, runtime: runtimes.Runtime, registered: list[int]
) -> None:
    """Jobs taken by a worker that stopped sending heartbeats before it started their run go
    back to the queue (a run it started is recovered by its lease instead: a slow worker keeps
    it). A worker of this process found deregistered (it was paused past the threshold, and
    pruned) registers again under its id, or procrastinate could never give it a job again."""
    settings = runtime.settings
    while True:
        await asyncio.sleep(settings.stall_check_seconds)
        try:
            stalled = await app.job_manager.get_stalled_jobs(
                seconds_since_heartbeat=settings.stalled_after_seconds
            )
            ids = [job.id for job in stalled if job.id is not None]
            async with runtime.engine.begin() as conn:
                unstarted = await jobs_db.unstarted_runs_jobs(conn, ids)
                superseded = await jobs_db.superseded_runs_jobs(conn, ids)
                for job_id in superseded:
                    log.warning("ending stalled job %s: its run has a newer job", job_id)
                    await jobs_db.end_job(conn, job_id)
            for job in stalled:
                if job.id in superseded:
                    continue
                # A run's job is its lease's once the run started; any other job is retried.
                if job.id in unstarted or job.task_name != RUN_TASK:
                    log.warning("retrying stalled job %s", job.id)
                    await app.job_manager.retry_job(job)
            await app.job_manager.prune_stalled_workers(
                seconds_since_heartbeat=settings.stalled_after_seconds
            )
            async with runtime.engine.begin() as conn:
                for worker_id in await jobs_db.reregister_workers(conn, registered[-1:]):
                    log.warning(
                        "this worker (%s) had been deregistered: registered again", worker_id
                    )
            await expire_waiting_runs(runtime.engine)
            await expire_approvals(runtime.engine)
        except Exception:
            log.exception("checking for stalled jobs failed")
