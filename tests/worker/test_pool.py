"""The worker pool's procrastinate app: every app built in a process runs the run task."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import create_async_engine

from app.config import Settings
from app.db.jobs import RUN_QUEUE, RUN_TASK
from app.llm.router import Router
from app.runs.writer import EventWriter
from app.worker.lease import WorkerLease
from app.worker.pool import queue_app
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
        app = queue_app(settings, runtime)
        assert RUN_TASK in app.tasks
        assert app.tasks[RUN_TASK].queue == RUN_QUEUE
        assert not [name for name in app.tasks if name.endswith(RUN_TASK) and name != RUN_TASK]
