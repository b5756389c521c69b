"""The worker pool's procrastinate app: every app built in a process runs the run task, on a
pool sized from the worker's concurrency."""

from __future__ import annotations

import procrastinate
from sqlalchemy.ext.asyncio import create_async_engine

from app.config import Settings
from app.db.jobs import RUN_QUEUE, RUN_TASK
from app.eventlog.writer import EventWriter
from app.llm.router import Router
from app.worker.lease import WorkerLease
from app.worker.pool import queue_app, queue_pool_size
from app.worker.runtime import Runtime


def test_every_queue_app_in_a_process_knows_the_run_task() -> None:
    # A second app used to know only "threadline:threadline:run_ask": its workers failed every
    # job with TaskNotFound and the runs stayed queued for good.
    url = "postgresql+asyncpg://nobody@localhost/none"
    settings = Settings(_env_file=None, database_url=url)
    engine = create_async_engine(url)  # never connects
    runtime = Runtime(
        engine, settings, Router(settings), EventWriter(engine, 0.05), WorkerLease(engine)
    )
    for _ in range(3):
        app = queue_app(settings, runtime, 8)
        assert RUN_TASK in app.tasks
        assert app.tasks[RUN_TASK].queue == RUN_QUEUE
        assert not [name for name in app.tasks if name.endswith(RUN_TASK) and name != RUN_TASK]


def test_the_queue_pool_is_sized_from_the_workers_concurrency_and_connects_directly() -> None:
    # `threadline worker --concurrency 40` used to size its pool from the setting (8): 6
    # connections for 40 runs' fetches, finishes and heartbeats.
    pooled = "postgresql+asyncpg://app@pgbouncer:6432/threadline"
    direct = "postgresql://app@postgres:5432/threadline"
    settings = Settings(
        _env_file=None, database_url=pooled, direct_database_url=direct, worker_concurrency=8
    )
    engine = create_async_engine(pooled)  # never connects
    runtime = Runtime(
        engine, settings, Router(settings), EventWriter(engine, 0.05), WorkerLease(engine)
    )
    for concurrency, size in ((1, 4), (8, 6), (40, 14), (400, 32)):
        assert queue_pool_size(concurrency) == size
        connector = queue_app(settings, runtime, concurrency).connector
        assert isinstance(connector, procrastinate.PsycopgConnector)
        # procrastinate keeps the pool's arguments until the app is opened
        assert connector._pool_args["max_size"] == size
        # LISTEN and psycopg's prepared statements do not survive a transaction pooler
        assert connector._pool_args["conninfo"] == direct
