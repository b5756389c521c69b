"""Procrastinate's queue, driven through its SQL API inside our own transactions.

Deferring a run's job in the ask's transaction (instead of through procrastinate's connector,
which has its own connection) makes "commit the ask and queue its run" one atomic step.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

RUN_TASK = "threadline:run_ask"
RUN_QUEUE = "runs"
WEBHOOK_TASK = "threadline:deliver_webhook"
WEBHOOK_QUEUE = "webhooks"
RETENTION_TASK = "threadline:purge"
MAINTENANCE_QUEUE = "maintenance"
SCHEDULE_TASK = "threadline:fire_schedules"
# The constraint a job taken for a worker that is no longer registered breaks.
UNREGISTERED_WORKER = "procrastinate_jobs_worker_id_fkey"


def session_lock(session_id: str, kind: str = "ask") -> str:
    """Jobs sharing a procrastinate lock run one at a time, in order: asks of a session never
    overlap, nor do its compactions. A compaction has a lock of its own so that an ask is never
    stuck in the queue behind a slow summarizer: it waits for it a bounded time instead
    (app/worker/compaction.py), and the compaction waits for the asks running before it."""
    return f"session:{session_id}" if kind == "ask" else f"session:{session_id}:{kind}"


async def defer_run(conn: AsyncConnection, run_id: str, session_id: str, kind: str = "ask") -> int:
    params = run_job_params(run_id, session_id, kind)
    return int((await conn.execute(text(f"SELECT {DEFER_ONE}"), params)).scalar_one())


async def defer_webhook(conn: AsyncConnection, delivery_ids: list[str]) -> None:
    """One job per delivery, committed with the run's end: it survives any restart."""
    for delivery_id in delivery_ids:
        await _defer(conn, WEBHOOK_QUEUE, WEBHOOK_TASK, {"delivery_id": delivery_id}, None)


# One job deferred, as an SQL expression (its id); the parameters: job_params().
DEFER_ONE = (
    "(procrastinate_defer_jobs_v1(ARRAY[ROW(:queue, :task, 0, :lock, NULL,"
    " CAST(:args AS jsonb), NULL)::procrastinate_job_to_defer_v1]))[1]"
)


# A run's job deferred already taken by the asking process's worker (`:worker_id`; NULL: by
# nobody), as CTEs of the statement that inserts its run: `job (id, claimed)`. Taken only where
# procrastinate_fetch_job_v2 would have let that worker take it: no job of its lock running nor
# waiting before it (a newest job of priority 0 comes after every other waiting job of priority
# >= 0). Inserted 'doing', it wakes no worker (procrastinate's NOTIFY and its 'deferred' event
# are for 'todo' inserts), and it stays the crash backup: the job of a worker that stops
# beating is retried like any other it held (app/worker/pool.py). A concurrent fetch that took
# a job of the same lock meanwhile wins on procrastinate's unique index of running locks: the
# job is then deferred as usual.
def claimed_or_deferred(only_if: str = "true") -> str:
    """The CTEs described above; `only_if`: an SQL condition, over CTEs before them, without
    which no job is claimed nor deferred (the statement then writes nothing)."""
    return (
        "claimed AS (INSERT INTO procrastinate_jobs"
        "  (queue_name, task_name, priority, lock, args, status, worker_id)"
        "  SELECT :queue, :task, 0, :lock, CAST(:args AS jsonb), 'doing',"
        "  CAST(:worker_id AS bigint)"
        f"  WHERE {only_if} AND CAST(:worker_id AS bigint) IS NOT NULL AND NOT EXISTS (SELECT 1"
        "   FROM procrastinate_jobs AS other_jobs WHERE other_jobs.lock = :lock"
        "   AND (other_jobs.status = 'doing'"
        "    OR (other_jobs.status = 'todo' AND other_jobs.priority >= 0)))"
        "  ON CONFLICT (lock) WHERE status = 'doing' DO NOTHING RETURNING id),"
        f" deferred AS (SELECT {DEFER_ONE} AS id"
        f"  WHERE {only_if} AND NOT EXISTS (SELECT 1 FROM claimed)),"
        " job AS (SELECT id, true AS claimed FROM claimed"
        "  UNION ALL SELECT id, false FROM deferred)"
    )


CLAIMED_OR_DEFERRED = claimed_or_deferred()


def job_params(queue: str, task: str, args: dict[str, str], lock: str | None) -> dict[str, Any]:
    return {"queue": queue, "task": task, "lock": lock, "args": json.dumps(args)}


def run_job_params(run_id: str, session_id: str, kind: str = "ask") -> dict[str, Any]:
    """DEFER_ONE's parameters for a run's job (for a statement that defers it with more)."""
    return job_params(RUN_QUEUE, RUN_TASK, {"run_id": run_id}, session_lock(session_id, kind))


async def _defer(
    conn: AsyncConnection, queue: str, task: str, args: dict[str, str], lock: str | None
) -> int:
    params = job_params(queue, task, args, lock)
    return int((await conn.execute(text(f"SELECT {DEFER_ONE}"), params)).scalar_one())


async def finish_job(conn: AsyncConnection, job_id: int, status: str) -> None:
    """End a job a worker of this process holds (doing): succeeded, failed..."""
    params = {"finish_job_id": job_id, "finish_job_status": status}
    await conn.execute(text(f"SELECT {FINISH_JOB}"), params)


# procrastinate's own end of a job (a statement's part: :finish_job_id, :finish_job_status).
FINISH_JOB = (
    "procrastinate_finish_job_v1(CAST(:finish_job_id AS bigint),"
    " CAST(:finish_job_status AS procrastinate_job_status), false)"
)


async def delete_jobs_of_runs(
    conn: AsyncConnection, run_ids: list[str], *, finished_only: bool = False
) -> None:
    """Forget the jobs of these runs and of their webhook deliveries (their args name them),
    except those a worker holds right now: it finishes them, finding their run gone; with
    `finished_only`, those still waiting too (a delivery's retry)."""
    if not run_ids:
        return
    kept = "('todo', 'doing')" if finished_only else "('doing')"
    deliveries = [
        str(i)
        for i in (
            await conn.execute(
                text("SELECT id FROM webhook_deliveries WHERE run_id = ANY(CAST(:ids AS uuid[]))"),
                {"ids": run_ids},
            )
        ).scalars()
    ]
    # Each condition matches a partial index on args (see the migration).
    for key, ids in (("run_id", run_ids), ("delivery_id", deliveries)):
        if ids:
            await conn.execute(
                text(
                    f"DELETE FROM procrastinate_jobs WHERE status NOT IN {kept}"
                    f" AND args ? '{key}' AND args->>'{key}' = ANY(CAST(:ids AS text[]))"
                ),
                {"ids": ids},
            )


async def delete_finished_maintenance_jobs(conn: AsyncConnection) -> int:
    """The maintenance queue's finished jobs (a retention pass each minute, schedules' firings
    every few seconds, by default)."""
    result = await conn.execute(
        text(
            "DELETE FROM procrastinate_jobs WHERE queue_name = :queue"
            " AND status NOT IN ('todo', 'doing')"
        ),
        {"queue": MAINTENANCE_QUEUE},
    )
    return int(result.rowcount or 0)


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


async def end_job(conn: AsyncConnection, job_id: int) -> None:
    """Mark a job that nobody will finish (its worker died) failed, if it is still waiting or
    running: a `doing` job holds its session's lock, so the session's next job would wait on it
    forever."""
    await conn.execute(
        text(
            "SELECT procrastinate_finish_job_v1(id, 'failed', false) FROM procrastinate_jobs"
            " WHERE id = :job_id AND status IN ('todo', 'doing')"
        ),
        {"job_id": job_id},
    )


async def unstarted_runs_jobs(conn: AsyncConnection, job_ids: list[int]) -> set[int]:
    """Of these jobs, those whose run has not started (still queued, or running between two
    attempts): a stalled worker took them but never began; a started run is its lease's."""
    if not job_ids:
        return set()
    query = text(
        "SELECT j.id FROM procrastinate_jobs j JOIN runs r ON r.job_id = j.id"
        " WHERE j.id = ANY(CAST(:ids AS bigint[]))"
        " AND (r.status = 'queued' OR (r.status = 'running' AND r.lease IS NULL))"
    )
    return {int(i) for i in (await conn.execute(query, {"ids": job_ids})).scalars()}


async def superseded_runs_jobs(conn: AsyncConnection, job_ids: list[int]) -> set[int]:
    """Of these jobs, those of a run that has another job now: a worker that paused the run
    (waiting for tool outputs or approvals) and died before its job was marked done leaves it
    `doing`, holding the session's lock, while the resumed run's job waits behind it."""
    if not job_ids:
        return set()
    query = text(
        "SELECT j.id FROM procrastinate_jobs j JOIN runs r"
        " ON r.id = CAST(j.args->>'run_id' AS uuid) AND r.job_id IS DISTINCT FROM j.id"
        " WHERE j.id = ANY(CAST(:ids AS bigint[]))"
    )
    return {int(i) for i in (await conn.execute(query, {"ids": job_ids})).scalars()}


async def reregister_workers(conn: AsyncConnection, worker_ids: list[int]) -> list[int]:
    """Put back the rows of these (live) workers if they were pruned; returns those put back."""
    if not worker_ids:
        return []
    query = text(
        "INSERT INTO procrastinate_workers (id) OVERRIDING SYSTEM VALUE"
        " SELECT unnest(CAST(:ids AS bigint[])) ON CONFLICT (id) DO NOTHING RETURNING id"
    )
    return [int(i) for i in (await conn.execute(query, {"ids": worker_ids})).scalars()]


async def waiting_jobs(conn: AsyncConnection) -> dict[str, tuple[int, float]]:
    """Per queue: jobs waiting to be taken (status todo) and the oldest one's age in seconds
    (since it was deferred), in one query (the metrics scrape)."""
    query = text(
        "SELECT j.queue_name, count(*),"
        " coalesce(extract(epoch FROM now() - min(e.at)), 0)"
        " FROM procrastinate_jobs j"
        " LEFT JOIN procrastinate_events e ON e.job_id = j.id AND e.type = 'deferred'"
        " WHERE j.status = 'todo' GROUP BY j.queue_name"
    )
    rows = (await conn.execute(query)).all()
    waiting = {RUN_QUEUE: (0, 0.0)}
    waiting.update({str(q): (int(n), max(0.0, float(age))) for q, n, age in rows})
    return waiting


# A job a worker held when its session was deleted ends soon after: only the newest jobs are
# looked at, so the sweep's cost does not grow with the queue's history.
ORPHAN_SWEEP_WINDOW = 100_000


async def delete_orphaned_jobs(conn: AsyncConnection) -> int:
    """Finished jobs whose run, or whose delivery, is gone: those a worker still held when
    their session was deleted (delete_jobs_of_runs leaves them to it)."""
    result = await conn.execute(
        text(
            "DELETE FROM procrastinate_jobs j WHERE j.status NOT IN ('todo', 'doing')"
            " AND j.id > (SELECT coalesce(max(id), 0) FROM procrastinate_jobs) - :window AND ("
            " (j.task_name = :run_task AND NOT EXISTS (SELECT 1 FROM runs r"
            "  WHERE CAST(r.id AS text) = j.args->>'run_id'))"
            " OR (j.task_name = :webhook_task AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d"
            "  WHERE CAST(d.id AS text) = j.args->>'delivery_id')))"
        ),
        {"run_task": RUN_TASK, "webhook_task": WEBHOOK_TASK, "window": ORPHAN_SWEEP_WINDOW},
    )
    return int(result.rowcount or 0)
