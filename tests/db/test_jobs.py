"""The session queue: when a job holding a session's lock ends, the next job of that lock is
announced at once (a trigger), so a queued run never waits for a worker's fetch poll."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest

from app.db.engine import libpq_url
from app.db.jobs import RUN_QUEUE, RUN_TASK, session_lock

CHANNEL = f"procrastinate_queue_v1#{RUN_QUEUE}"


@pytest.fixture
async def conn(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    connection = await asyncpg.connect(libpq_url(database_url))
    try:
        yield connection
    finally:
        await connection.close()


async def job(conn: asyncpg.Connection, lock: str, status: str) -> int:
    job_id: int = await conn.fetchval(
        "INSERT INTO procrastinate_jobs (queue_name, task_name, lock, args, status)"
        " VALUES ($1, $2, $3, '{}', $4::procrastinate_job_status) RETURNING id",
        RUN_QUEUE,
        RUN_TASK,
        lock,
        status,
    )
    return job_id


async def announced_after(conn: asyncpg.Connection, end_job: str, job_id: int) -> list[int]:
    """The jobs announced on the runs queue's channel while `end_job` runs for `job_id`."""
    heard: asyncio.Queue[int] = asyncio.Queue()

    def listener(_conn: object, _pid: int, _channel: str, payload: str) -> None:
        heard.put_nowait(json.loads(payload)["job_id"])

    await conn.add_listener(CHANNEL, listener)
    try:
        await conn.execute(end_job, job_id)
        # A marker after it: notifications arrive in commit order, so once it is heard, every
        # announcement of the job's end has been too.
        marker = -int(uuid.uuid4().int % 1_000_000) - 1
        payload = json.dumps({"type": "job_inserted", "job_id": marker})
        await conn.execute("SELECT pg_notify($1, $2)", CHANNEL, payload)
        announced = []
        while (next_id := await asyncio.wait_for(heard.get(), timeout=60)) != marker:
            announced.append(next_id)
        return announced
    finally:
        await conn.remove_listener(CHANNEL, listener)


FINISH = "SELECT procrastinate_finish_job_v1($1, 'succeeded', false)"
DELETE = "DELETE FROM procrastinate_jobs WHERE id = $1"


@pytest.mark.parametrize("end_job", [FINISH, DELETE], ids=["finished", "deleted"])
async def test_the_next_job_of_a_session_is_announced_when_the_running_one_ends(
    conn: asyncpg.Connection, end_job: str
) -> None:
    lock = session_lock(str(uuid.uuid4()))
    running = await job(conn, lock, "doing")
    queued = await job(conn, lock, "todo")
    later = await job(conn, lock, "todo")
    assert await announced_after(conn, end_job, running) == [queued]  # the first in line only
    assert later > queued


async def test_nothing_is_announced_when_no_job_of_the_session_waits(
    conn: asyncpg.Connection,
) -> None:
    lock = session_lock(str(uuid.uuid4()))
    other = await job(conn, session_lock(str(uuid.uuid4())), "todo")  # another session's
    running = await job(conn, lock, "doing")
    assert await announced_after(conn, FINISH, running) == []
    assert other
