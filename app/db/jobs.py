"""Procrastinate's queue, driven through its SQL API inside our own transactions.

Deferring a run's job in the ask's transaction (instead of through procrastinate's connector,
which has its own connection) makes "commit the ask and queue its run" one atomic step.
"""

from __future__ import annotations

import json

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

RUN_TASK = "threadline:run_ask"
RUN_QUEUE = "runs"


def session_lock(session_id: str, kind: str = "ask") -> str:
    """Jobs sharing a procrastinate lock run one at a time, in order: asks of a session never
    overlap, nor do its compactions. A compaction has a lock of its own so that an ask is never
    stuck in the queue behind a slow summarizer: it waits for it a bounded time instead
    (app/worker/compaction.py), and the compaction waits for the asks running before it."""
    return f"session:{session_id}" if kind == "ask" else f"session:{session_id}:{kind}"


async def defer_run(conn: AsyncConnection, run_id: str, session_id: str, kind: str = "ask") -> int:
    query = text(
        "SELECT (procrastinate_defer_jobs_v1(ARRAY[ROW(:queue, :task, 0, :lock, NULL,"
        " CAST(:args AS jsonb), NULL)::procrastinate_job_to_defer_v1]))[1]"
    )
    params = {
        "queue": RUN_QUEUE,
        "task": RUN_TASK,
        "lock": session_lock(session_id, kind),
        "args": json.dumps({"run_id": run_id}),
    }
    return int((await conn.execute(query, params)).scalar_one())


async def cancel_job(conn: AsyncConnection, job_id: int) -> bool:
    """Cancel a job still waiting, or ask the worker running it to abort.

    Returns True when no worker holds the job (so the caller must end the run itself). The job
    row stays locked until the caller commits, so no worker can take it meanwhile.
    """
    status = (
        await conn.execute(
            text("SELECT status FROM procrastinate_jobs WHERE id = :job_id FOR UPDATE"),
            {"job_id": job_id},
        )
    ).scalar()
    await conn.execute(
        text("SELECT procrastinate_cancel_job_v1(:job_id, true, false)"), {"job_id": job_id}
    )
    return status != "doing"
