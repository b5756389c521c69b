"""Postgres restarted under streaming runs (a crash: `pg_ctl -m immediate`): every run still
ends exactly once with its terminal event, its journal holds nothing twice, and its session
takes the next ask. The service is one `threadline serve` process on a cluster of its own."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.config import Settings
from app.db.embedded import EmbeddedPostgres
from app.db.migrate import upgrade_to_head
from testkit.api import history, new_session
from testkit.server import free_port
from testkit.sse_client import TERMINAL, collect
from testkit.upstream import FakeUpstream, Text
from tests.conftest import issue_key
from tests.e2e import Process, e2e_env, process_env

RUNS = 4


@pytest.fixture
def cluster() -> Iterator[EmbeddedPostgres]:
    root = Path(tempfile.mkdtemp(prefix="threadline-restart-"))
    root.chmod(0o755)  # the postgres user must enter it when we run as root
    postgres = EmbeddedPostgres(root / "data", server_settings={"fsync": "off"})
    try:
        upgrade_to_head(postgres.start())
        yield postgres
    finally:
        postgres.stop()
        shutil.rmtree(root, ignore_errors=True)


async def until_answered(client: httpx.AsyncClient, method: str, url: str, **kw: Any) -> Any:
    """The service's answer once the database is back (it answers errors meanwhile)."""
    deadline = time.monotonic() + 120
    while True:
        try:
            response = await client.request(method, url, **kw)
            if response.status_code < 500:
                return response
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "the service never recovered"
        await asyncio.sleep(0.2)


@pytest.mark.slow
async def test_runs_streaming_through_a_database_restart_all_end_once(
    cluster: EmbeddedPostgres, upstream: FakeUpstream
) -> None:
    upstream.clear()
    settings = Settings(database_url=cluster.url, **e2e_env(upstream))
    port = free_port()
    # Heartbeats would take over only after an hour (the default is 30 s): what ends the runs
    # is the workers retrying their writes and the recovery of runs left without a job.
    env = process_env(settings, port=port, stalled_after_seconds=3600)
    server = Process(["serve", "--port", str(port)], env, f"http://127.0.0.1:{port}/readyz")
    try:
        key = await asyncio.to_thread(issue_key, settings, f"restart-{uuid.uuid4()}")
        headers = {"Authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=60
        ) as api:
            for _ in range(RUNS):
                upstream.script(*[Text("x ") for _ in range(60)], token_delay=0.03)
            for _ in range(RUNS):
                upstream.script(Text("after the restart"))
            sessions = [(await new_session(api))["id"] for _ in range(RUNS)]
            runs = []
            for sid in sessions:
                body = {"input": "q", "stream": False}
                runs.append((await api.post(f"/v1/sessions/{sid}/ask", json=body)).json()["id"])
            for run_id in runs:
                await collect(api, "GET", f"/v1/runs/{run_id}/events", until="message.delta")

            await asyncio.to_thread(cluster.stop, "immediate")
            # Long enough for the answers to end while it is down: their last writes must wait.
            await asyncio.sleep(6)
            await asyncio.to_thread(cluster.start)

            for sid, run_id in zip(sessions, runs, strict=True):
                done = (
                    await until_answered(
                        api, "GET", f"/v1/runs/{run_id}", params={"wait": "true", "timeout": 60}
                    )
                ).json()
                assert done["status"] == "completed", (done["error"], done["result"])
                events = await collect(api, "GET", f"/v1/runs/{run_id}/events")
                assert [e.id for e in events] == list(range(1, len(events) + 1))
                assert [e.type for e in events if e.type in TERMINAL] == ["run.completed"]
                assert events[-1].type == "run.completed"
                entries = await history(api, sid)
                assert len({e["id"] for e in entries}) == len(entries)
                kinds = Counter(e["kind"] for e in entries)
                assert kinds["run_end"] == 1 and kinds["usage"] <= 1, kinds
                answers = [e for e in entries if e["kind"] == "message"][1:]
                assert [a["payload"].get("status") for a in answers][-1] is None

            upstream.script(Text("next"))
            for sid in sessions:
                upstream.script(Text("next"))
                nxt = await api.post(f"/v1/sessions/{sid}/ask", json={"input": "again"})
                assert nxt.status_code == 200, nxt.text
    finally:
        server.stop()
