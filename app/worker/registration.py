"""This process's procrastinate worker, kept registered and kept working.

procrastinate stops its worker for good when a job fetch or a heartbeat raises: the process
then goes on serving while it never takes a job again. A fetch breaks when the worker was
deregistered behind its back (paused past the stall threshold, another worker pruned it: the
job's foreign key to its registration fails), a heartbeat when the database blips. Here a
pruned worker registers again under its id and fetches once more, a failed heartbeat waits for
the next one, and a worker that stops anyway is started again (see `work_queues`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable

import procrastinate
import psycopg
from procrastinate.jobs import Job
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db import jobs as jobs_db

log = logging.getLogger(__name__)


def unregistered_worker(exc: BaseException) -> bool:
    """Whether `exc` (as procrastinate raises it) is a job taken for a worker whose
    registration is gone."""
    cause = exc.__cause__
    return (
        isinstance(cause, psycopg.errors.ForeignKeyViolation)
        and cause.diag.constraint_name == jobs_db.UNREGISTERED_WORKER
    )


def keep_registered(app: procrastinate.App, engine: AsyncEngine) -> list[int]:
    """Patch `app`'s job manager as the module says; returns the ids its worker registers
    under, newest last (they are registered again when found pruned: see pool._retry_stalled)."""
    manager = app.job_manager
    ids: list[int] = []
    register, fetch, beat = manager.register_worker, manager.fetch_job, manager.update_heartbeat

    async def register_worker() -> int:
        worker_id = await register()
        ids.append(worker_id)
        return worker_id

    async def fetch_job(queues: Iterable[str] | None, worker_id: int) -> Job | None:
        try:
            return await fetch(queues, worker_id)
        except procrastinate.exceptions.ConnectorException as exc:
            if not unregistered_worker(exc):
                raise
        async with engine.begin() as conn:
            await jobs_db.reregister_workers(conn, [worker_id])
        log.warning("this worker (%s) had been deregistered: registered again", worker_id)
        return await fetch(queues, worker_id)

    async def update_heartbeat(worker_id: int) -> None:
        try:
            await beat(worker_id)
        except Exception:
            # A heartbeat too late for the stall threshold gets the worker pruned, which the
            # next fetch mends; stopping the worker here would abort its runs.
            log.warning("this worker's heartbeat failed: trying again at the next", exc_info=True)

    manager.register_worker = register_worker  # type: ignore[method-assign]
    manager.fetch_job = fetch_job  # type: ignore[method-assign]
    manager.update_heartbeat = update_heartbeat  # type: ignore[method-assign]
    return ids


async def work_queues(
    run_worker: Callable[[], Awaitable[None]], restart_after_seconds: float
) -> None:
    """Run procrastinate's worker (`run_worker`) until cancelled, starting it again whenever it
    stops on its own."""
    while True:
        try:
            await run_worker()
            log.error("the queue worker stopped: starting it again")
        except Exception:
            log.exception("the queue worker failed: starting it again")
        await asyncio.sleep(restart_after_seconds)
