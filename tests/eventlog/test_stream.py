"""The one stream path: a wire's opening, its frames until the run's end (or its own), its
closing; a stream that ends, cleanly or by an error of ours, is not a client gone."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncEngine

from app.config import Settings
from app.db.engine import libpq_url
from app.eventlog.hub import EventHub
from app.eventlog.stream import Row, Wire, run_stream, sse_frame
from testkit.api import new_session
from testkit.sse_client import collect
from testkit.upstream import FakeUpstream, Text


@pytest.fixture
async def hub(e2e_engine: AsyncEngine, e2e_settings: Settings) -> AsyncIterator[EventHub]:
    assert e2e_settings.database_url is not None
    hub = EventHub(e2e_engine, libpq_url(e2e_settings.database_url), poll_seconds=3600)
    await hub.start()
    yield hub
    await hub.stop()


class Types(Wire):
    """Each event's type as the data of a frame; over after `last` if given."""

    def __init__(self, last: str | None = None, fail: bool = False) -> None:
        self.last = last
        self.fail = fail
        self.closed = False

    def opening(self) -> list[bytes]:
        return [sse_frame("open")]

    async def frames(self, rows: list[Row]) -> list[bytes]:
        if self.fail:
            raise RuntimeError("a wire that fails")
        out = []
        for row in rows:
            if self.ended:
                break
            out.append(sse_frame(row["type"]))
            self.ended = row["type"] == self.last
        return out

    def closing(self) -> list[bytes]:
        return [sse_frame("closed")]

    def close(self) -> None:
        self.closed = True


async def streamed(hub: EventHub, run_id: str, wire: Wire, gone: list[str]) -> list[str]:
    """The data lines of the run's stream through `wire`, read to its end."""

    async def client_gone() -> None:
        gone.append(run_id)

    app = FastAPI()
    app.get("/")(lambda: run_stream(hub, run_id, 0, 1.0, wire, client_gone))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://stream") as client:
        body = (await client.get("/")).text
    return [line.removeprefix("data: ") for line in body.splitlines() if line.startswith("data:")]


async def test_a_wire_gets_the_run_to_its_end_or_its_own(
    hub: EventHub, api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = (await new_session(api))["id"]
    upstream.script(Text("done"))
    events = await collect(api, "POST", f"/v1/sessions/{sid}/ask", json={"input": "q"})
    run_id = str(events[0].data["run_id"])
    gone: list[str] = []
    whole = Types()
    assert await streamed(hub, run_id, whole, gone) == [
        "open",
        *(e.type for e in events),
        "closed",
    ]
    cut = Types(last="run.started")
    assert await streamed(hub, run_id, cut, gone) == [
        "open",
        "run.created",
        "run.started",
        "closed",
    ]
    assert whole.closed and cut.closed
    assert gone == []  # a stream that ended is no client gone


async def test_an_error_of_ours_drops_the_stream_without_an_end_or_a_cancel(
    hub: EventHub, api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = (await new_session(api))["id"]
    upstream.script(Text("done"))
    events = await collect(api, "POST", f"/v1/sessions/{sid}/ask", json={"input": "q"})
    gone: list[str] = []
    failing = Types(fail=True)
    with pytest.raises(RuntimeError, match="a wire that fails"):
        await streamed(hub, str(events[0].data["run_id"]), failing, gone)
    assert failing.closed and gone == []
