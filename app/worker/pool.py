"""The worker pool: procrastinate's worker running runs, plus the event writer, the retry of
stalled jobs (a worker that died: its heartbeat stopped) and the pruning of old run events."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import procrastinate
from procrastinate import JobContext

from app.config import Settings
from app.db import events as events_db
from app.db.engine import create_engine
from app.db.jobs import RUN_QUEUE, RUN_TASK
from app.llm.router import Router
from app.llm.tokenizers import stored_counter
from app.runs.writer import EventWriter
from app.services.asks import expire_waiting_runs
from app.tools.webhook import aclose_shared_client
from app.worker import runtime as runtimes
from app.worker.run import execute_run

log = logging.getLogger(__name__)


def libpq_url(database_url: str) -> str:
    """procrastinate's connector speaks psycopg, which wants a plain postgresql:// URL."""
    for prefix in ("postgresql+asyncpg://", "postgres://"):
        if database_url.startswith(prefix):
            return "postgresql://" + database_url[len(prefix) :]
    return database_url


def queue_app(settings: Settings, runtime: runtimes.Runtime) -> procrastinate.App:
    """A procrastinate app whose workers execute runs with `runtime`."""
    assert settings.database_url is not None
    # The pool serves job fetches, finishes, heartbeats and LISTEN: psycopg_pool's default of 4
    # starves a worker running many runs at once.
    size = max(4, min(settings.worker_concurrency // 4 + 4, 32))
    connector = procrastinate.PsycopgConnector(
        conninfo=libpq_url(settings.database_url), min_size=2, max_size=size
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

    return app


@contextlib.asynccontextmanager
async def worker_pool(settings: Settings, concurrency: int) -> AsyncIterator[None]:
    """Run `concurrency` run-executing workers in this process until the block exits."""
    engine = create_engine(settings)
    await asyncio.to_thread(stored_counter)  # load the vocabulary now, not on the first ask
    writer = EventWriter(engine, settings.event_tick_seconds)
    runtime = runtimes.Runtime(engine, settings, Router(settings), writer)
    app = queue_app(settings, runtime)
    async with app.open_async():
        background = [
            asyncio.create_task(writer.run(), name="event-writer"),
            asyncio.create_task(_retry_stalled(app, runtime), name="stalled-jobs"),
            asyncio.create_task(_prune_events(engine, settings), name="event-pruner"),
            asyncio.create_task(
                app.run_worker_async(
                    queues=[RUN_QUEUE],
                    concurrency=concurrency,
                    install_signal_handlers=False,
                    update_heartbeat_interval=settings.worker_heartbeat_seconds,
                    shutdown_graceful_timeout=settings.worker_shutdown_seconds,
                ),
                name="procrastinate-worker",
            ),
        ]
        try:
            yield
        finally:
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
            await aclose_shared_client()
            await engine.dispose()


async def _retry_stalled(app: procrastinate.App, runtime: runtimes.Runtime) -> None:
    """Jobs whose worker stopped sending heartbeats go back to the queue; the run resumes
    from the journal on whichever worker takes it."""
    settings = runtime.settings
    while True:
        await asyncio.sleep(settings.stall_check_seconds)
        try:
            stalled = await app.job_manager.get_stalled_jobs(
                seconds_since_heartbeat=settings.stalled_after_seconds
            )
            for job in stalled:
                log.warning("retrying stalled job %s", job.id)
                await app.job_manager.retry_job(job)
            await app.job_manager.prune_stalled_workers(
                seconds_since_heartbeat=settings.stalled_after_seconds
            )
            await expire_waiting_runs(runtime.engine)
        except Exception:
            log.exception("checking for stalled jobs failed")


async def _prune_events(engine: object, settings: Settings) -> None:
    from sqlalchemy.ext.asyncio import AsyncEngine

    assert isinstance(engine, AsyncEngine)
    while True:
        await asyncio.sleep(min(settings.event_retention_seconds / 4, 300))
        try:
            async with engine.begin() as conn:
                pruned = await events_db.prune(conn, settings.event_retention_seconds)
            if pruned:
                log.info("pruned %d run events", pruned)
        except Exception:
            log.exception("pruning run events failed")
