"""The event hub's followers end with their run, whatever their resume point and whether the
events are still kept: against the served run's real tables and notifications, with a hub that
never polls, so every ending comes from what it reads or is notified of."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from asyncpg.exceptions import CannotConnectNowError
from sqlalchemy.ext.asyncio import AsyncEngine

from app.config import Settings
from app.db.engine import libpq_url
from app.eventlog import hub as hub_module
from app.eventlog import store as event_store
from app.eventlog.hub import PAGE, EventHub
from testkit.api import new_session
from testkit.sse_client import SAFETY_NET_SECONDS, collect
from testkit.upstream import FakeUpstream, Stall, Text
from tests.eventlog.test_writer import running_runs


@pytest.fixture
async def hub(e2e_engine: AsyncEngine, e2e_settings: Settings) -> AsyncIterator[EventHub]:
    assert e2e_settings.database_url is not None
    hub = EventHub(e2e_engine, libpq_url(e2e_settings.database_url), poll_seconds=3600)
    await hub.start()
    yield hub
    await hub.stop()


async def followed(hub: EventHub, run_id: str, after_seq: int) -> list[dict[str, Any]]:
    """Everything a follower gets, until the hub ends it (the timeout is only a safety net)."""
    try:
        async with asyncio.timeout(SAFETY_NET_SECONDS):
            return [row async for row in hub.follow(run_id, after_seq)]
    except TimeoutError:
        raise AssertionError(f"following {run_id} after {after_seq} never ended") from None


async def test_a_follower_of_a_finished_run_ends_whatever_it_has_seen(
    hub: EventHub, api: httpx.AsyncClient, upstream: FakeUpstream, e2e_engine: AsyncEngine
) -> None:
    sid = (await new_session(api))["id"]
    upstream.script(Text("done"))
    events = await collect(api, "POST", f"/v1/sessions/{sid}/ask", json={"input": "q"})
    run_id, terminal = str(events[0].data["run_id"]), events[-1].id
    assert [r["seq"] for r in await followed(hub, run_id, 0)] == [e.id for e in events]
    assert [r["seq"] for r in await followed(hub, run_id, terminal - 1)] == [terminal]
    for seen_it_all in (terminal, terminal + 1, 2**40):
        assert await followed(hub, run_id, seen_it_all) == []
        assert not await hub.has_more(run_id, seen_it_all)
    assert await hub.has_more(run_id, terminal - 1)
    async with e2e_engine.begin() as conn:  # past the retention window
        await event_store.prune(conn, 0)
    assert await followed(hub, run_id, 0) == []
    assert not await hub.has_more(run_id, 0)


async def test_a_replay_comes_in_pages_that_end_at_the_terminal_event(
    hub: EventHub, api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    """What a follower reads from the table comes as one batch (an SSE response writes it at
    once), from its resume point through the terminal event, and nothing after it."""
    run_id, seqs = await finished_run(api, upstream)
    assert len(seqs) > 2
    batches = [b async for b in hub.follow_batches(run_id, 1)]
    assert [[r["seq"] for r in b] for b in batches] == [seqs[1:]]
    assert batches[0][-1]["type"] == "run.completed"


async def test_a_follower_past_a_live_runs_last_event_ends_when_the_run_ends(
    hub: EventHub, api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = (await new_session(api))["id"]
    # Stalled until cancelled (the stall only bounds a test that went wrong).
    upstream.script(Text("first"), Stall(600), Text("never"))
    started = await collect(
        api, "POST", f"/v1/sessions/{sid}/ask", json={"input": "go"}, until="message.delta"
    )
    run_id = str(started[0].data["run_id"])
    assert await hub.has_more(run_id, 10_000)  # live: there may be more
    beyond = asyncio.create_task(followed(hub, run_id, 10_000))
    whole = asyncio.create_task(followed(hub, run_id, 0))
    assert (await api.post(f"/v1/runs/{run_id}/cancel")).status_code == 200
    assert await beyond == []
    rows = await whole
    assert rows[-1]["type"] == "run.cancelled"
    assert [r["seq"] for r in rows] == list(range(1, len(rows) + 1))


def failing_reads(
    hub: EventHub, monkeypatch: pytest.MonkeyPatch, error: Exception, times: int
) -> list[int]:
    """Make the hub's table reads fail with `error` `times` times (then read for real); the
    returned list counts the attempts."""
    real, attempts = hub._read, []

    async def read(run_id: str, after_seq: int, limit: int = PAGE) -> event_store.Backlog:
        attempts.append(after_seq)
        if len(attempts) <= times:
            raise error
        return await real(run_id, after_seq, limit)

    monkeypatch.setattr(hub, "_read", read)
    monkeypatch.setattr(hub_module, "RETRY_FIRST_SECONDS", 0.001)
    return attempts


async def finished_run(api: httpx.AsyncClient, upstream: FakeUpstream) -> tuple[str, list[int]]:
    sid = (await new_session(api))["id"]
    upstream.script(Text("done"))
    events = await collect(api, "POST", f"/v1/sessions/{sid}/ask", json={"input": "q"})
    return str(events[0].data["run_id"]), [e.id for e in events]


async def test_a_follower_reads_through_an_outage(
    hub: EventHub, api: httpx.AsyncClient, upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reads that fail because the database is unreachable are tried again: the follower gets
    every event once, as if nothing happened."""
    run_id, seqs = await finished_run(api, upstream)
    attempts = failing_reads(hub, monkeypatch, CannotConnectNowError("starting up"), times=3)
    assert [r["seq"] for r in await followed(hub, run_id, 0)] == seqs
    assert len(attempts) == 4


async def test_before_a_stream_an_outage_is_not_waited_for(
    hub: EventHub, api: httpx.AsyncClient, upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """has_more decides whether to open a stream: it fails at once (the route answers 503)."""
    run_id, _ = await finished_run(api, upstream)
    attempts = failing_reads(hub, monkeypatch, CannotConnectNowError("starting up"), times=1)
    with pytest.raises(CannotConnectNowError):
        await hub.has_more(run_id, 0)
    assert len(attempts) == 1


async def test_a_long_outage_or_another_error_ends_the_follower_with_it(
    e2e_engine: AsyncEngine,
    e2e_settings: Settings,
    api: httpx.AsyncClient,
    upstream: FakeUpstream,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past outage_seconds the follower gives up (the client resumes with Last-Event-ID); an
    error that is no outage is raised at once."""
    run_id, _ = await finished_run(api, upstream)
    assert e2e_settings.database_url is not None
    url = libpq_url(e2e_settings.database_url)
    impatient = EventHub(e2e_engine, url, outage_seconds=0)
    down = failing_reads(impatient, monkeypatch, CannotConnectNowError("down"), times=10**6)
    with pytest.raises(CannotConnectNowError):
        await followed(impatient, run_id, 0)
    assert len(down) >= 1
    broken = EventHub(e2e_engine, url)
    bug = failing_reads(broken, monkeypatch, ValueError("a bug"), times=10**6)
    with pytest.raises(ValueError, match="a bug"):
        await followed(broken, run_id, 0)
    assert len(bug) == 1


async def test_a_stalled_follower_holds_a_bounded_buffer_and_gets_every_event_later(
    e2e_engine: AsyncEngine,
    e2e_settings: Settings,
    api: httpx.AsyncClient,
    upstream: FakeUpstream,
) -> None:
    """A follower whose client stops reading keeps at most its buffer of live rows; the rest
    are dropped, and read from the table once it reads again: every event once, in order."""
    assert e2e_settings.database_url is not None
    buffer = 3
    small = EventHub(
        e2e_engine,
        libpq_url(e2e_settings.database_url),
        poll_seconds=3600,
        subscriber_buffer=buffer,
    )
    await small.start()
    try:
        sid = (await new_session(api))["id"]
        words = [f"w{i} " for i in range(30)]
        # Each token a tick or more apart: one event each, far more than the buffer holds.
        upstream.script(*(Text(w) for w in words), token_delay=0.05)
        asked = await api.post(f"/v1/sessions/{sid}/ask", json={"input": "go", "stream": False})
        run_id = str(asked.json()["id"])
        follower = small.follow(run_id, 0)
        first = [await anext(follower)]
        while first[-1]["type"] != "message.delta":  # live now: past its replay
            first.append(await anext(follower))
        # then the client stops reading
        for _ in range(600):  # the run ends meanwhile (a failure bound, not a measure)
            if (await api.get(f"/v1/runs/{run_id}")).json()["status"] == "completed":
                break
            await asyncio.sleep(0.1)
        (subscriber,) = small._feeds[run_id].subscribers
        assert subscriber.queue.qsize() <= buffer
        assert subscriber.overflowed
        rows = [*first, *[row async for row in follower]]
        assert [r["seq"] for r in rows] == list(range(1, len(rows) + 1))
        assert rows[-1]["type"] == "run.completed"
        deltas = "".join(r["data"]["text"] for r in rows if r["type"] == "message.delta")
        assert deltas == "".join(words)
        assert run_id not in small._feeds  # the follower let go of its feed
    finally:
        await small.stop()


def test_a_follower_that_hears_nothing_reads_the_table_less_and_less_often() -> None:
    waits = [hub_module.poll_wait(2.0, reads) for reads in range(8)]
    assert waits == [2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0, 30.0]
    assert hub_module.poll_wait(3600.0, 5) == 3600.0  # never shorter than the first wait
    assert hub_module.poll_wait(2.0, 10**6) == 30.0


class Counted:
    """Calls of a function of app/eventlog/store.py, counted (and made): the hub's reads."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
        self.count = 0
        read = getattr(event_store, name)

        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return await read(*args, **kwargs)

        monkeypatch.setattr(event_store, name, counted)


def counting_fetches(monkeypatch: pytest.MonkeyPatch) -> Counted:
    """The hub's fetches of announced events from the table."""
    return Counted(monkeypatch, "read_events_of_runs")


def counting_replays(monkeypatch: pytest.MonkeyPatch) -> Counted:
    """The hub's reads of a follower's backlog from the table."""
    return Counted(monkeypatch, "read_backlog")


@pytest.fixture
async def quiet_hub(e2e_engine: AsyncEngine, e2e_settings: Settings) -> AsyncIterator[EventHub]:
    """A hub that hears only what its test announces (`announce`): no LISTEN connection, whose
    notifications of other tests' work (or its reconnect) would come at any moment."""
    assert e2e_settings.database_url is not None
    hub = EventHub(e2e_engine, libpq_url(e2e_settings.database_url), poll_seconds=3600)
    hub._tasks = [asyncio.create_task(hub._fetch_loop())]
    yield hub
    await hub.stop()


async def announce(hub: EventHub, run_id: str, seq: int) -> None:
    """The NOTIFY of the run's events up to `seq`, heard and acted on by the fetch loop."""
    hub._on_notify(None, 0, event_store.CHANNEL, json.dumps({"runs": {run_id: seq}}))
    for _ in range(10_000):
        if not hub._fetch_needed.is_set():
            break
        await asyncio.sleep(0)
    await asyncio.sleep(0.05)  # a fetch it started has ended (the counts below wait for none)


async def next_row(follower: AsyncIterator[dict[str, Any]]) -> dict[str, Any]:
    async with asyncio.timeout(SAFETY_NET_SECONDS):
        return await anext(follower)


async def test_events_this_process_commits_reach_its_followers_from_memory_or_the_table(
    quiet_hub: EventHub, e2e_engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inside `committing`, a commit's NOTIFY is not fetched when the publish hands the rows
    out; when it does not (no publish: a failed hand-out, a gap), they are fetched once the
    commit is over. A follower never polls here: every row comes from one of the two."""
    hub = quiet_hub
    # Waiting for tool outputs: no worker of the shared database recovers it meanwhile.
    (run_id,) = await running_runs(e2e_engine, 1, status="requires_action")
    fetches = counting_fetches(monkeypatch)

    async def commit(kind: str, publish: bool) -> None:
        rows = [(run_id, kind, {"text": kind})]
        with hub.committing([run_id]):
            async with e2e_engine.begin() as conn:
                last = await event_store.append_events(conn, rows)
            await announce(hub, run_id, last[run_id])  # heard before the hand-out
            if publish:
                hub.publish(event_store.numbered(rows, last))

    follower = hub.follow(run_id, 0)
    await commit("message.delta", publish=True)
    assert (await next_row(follower))["seq"] == 1  # replayed: committed before it read

    async def live(kind: str, publish: bool) -> dict[str, Any]:
        waiting = asyncio.create_task(next_row(follower))
        for _ in range(int(SAFETY_NET_SECONDS / 0.01)):  # until past its replay: live
            if hub._feeds[run_id].positioned:
                break
            await asyncio.sleep(0.01)
        await commit(kind, publish)
        return await waiting

    assert (await live("message.delta", publish=True))["seq"] == 2
    assert fetches.count == 0  # from memory
    assert (await live("message.delta", publish=False))["seq"] == 3
    assert fetches.count == 1  # from the table, once the commit was over
    assert (await live("run.completed", publish=True))["type"] == "run.completed"
    assert fetches.count == 1
    await follower.aclose()


async def test_a_follower_still_replaying_is_not_fetched_for_and_misses_nothing(
    quiet_hub: EventHub, e2e_engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Announcements heard while a follower has not finished its replay are not fetched for
    it; once it has, what was announced after its replay's read is fetched."""
    hub = quiet_hub
    # Waiting for tool outputs: no worker of the shared database recovers it meanwhile.
    (run_id,) = await running_runs(e2e_engine, 1, status="requires_action")
    for i in range(3):
        async with e2e_engine.begin() as conn:
            await event_store.append_events(conn, [(run_id, "message.delta", {"text": str(i)})])
    fetches = counting_fetches(monkeypatch)
    follower = hub.follow(run_id, 0)
    assert (await next_row(follower))["seq"] == 1  # stalled in its replay from here
    async with e2e_engine.begin() as conn:
        await event_store.append_events(conn, [(run_id, "message.delta", {"text": "3"})])
    await announce(hub, run_id, 4)  # heard while it replays: deferred
    assert fetches.count == 0
    seqs = [(await next_row(follower))["seq"] for _ in range(3)]
    assert seqs == [2, 3, 4] and fetches.count == 1  # seq 4 fetched once it was live
    await follower.aclose()


def event(run_id: str, seq: int, kind: str = "message.delta") -> dict[str, Any]:
    return {"run_id": run_id, "seq": seq, "type": kind, "data": {"text": str(seq)}}


async def test_an_expected_runs_stream_is_handed_what_its_worker_published_before_it(
    quiet_hub: EventHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run an ask of this process hands to this process's worker, its stream about to follow
    it: the rows published before the stream subscribes are its replay, with no read of the
    table (which has no such run here: a read would end the stream at once, empty)."""
    hub, run_id, replays = quiet_hub, str(uuid.uuid4()), counting_replays(monkeypatch)
    hub.expect(event(run_id, 1, "run.created"))
    hub.publish([event(run_id, 2, "run.started"), event(run_id, 3)])
    follower = hub.follow(run_id, 0)
    assert [(await next_row(follower))["seq"] for _ in range(3)] == [1, 2, 3]
    hub.publish([event(run_id, 4), event(run_id, 5, "run.completed")])  # live now
    assert [row["seq"] async for row in follower] == [4, 5]
    assert replays.count == 0
    assert run_id not in hub._feeds and run_id not in hub._expected


async def test_an_expected_run_with_a_gap_or_not_followed_from_its_start_reads_the_table(
    quiet_hub: EventHub, e2e_engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What was published is the replay only when it is every row from the first: after a gap
    (another transaction's rows), past the rows kept, or for a follower resuming later, the
    table is read as for any run."""
    hub = quiet_hub
    monkeypatch.setattr(hub_module, "EXPECTED_ROWS", 3)
    gap, many, resumed = await running_runs(e2e_engine, 3, status="requires_action")
    for run_id in (gap, many, resumed):
        async with e2e_engine.begin() as conn:
            await event_store.append_events(conn, [(run_id, "message.delta", {})] * 5)
    replays = counting_replays(monkeypatch)
    hub.expect(event(gap, 1))
    hub.publish([event(gap, 3)])
    hub.expect(event(many, 1))
    hub.publish([event(many, seq) for seq in (2, 3, 4)])
    hub.expect(event(resumed, 1))
    for run_id, after in ((gap, 0), (many, 0), (resumed, 1)):
        follower = hub.follow(run_id, after)
        rows = [await next_row(follower) for _ in range(5 - after)]
        assert [r["seq"] for r in rows] == list(range(after + 1, 6))
        assert all(r["data"] == {} for r in rows)  # the table's rows
        await follower.aclose()
    assert replays.count == 3


async def test_expectations_no_stream_takes_are_forgotten(
    quiet_hub: EventHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ask whose client left before its stream subscribed leaves an expectation no one
    takes: at most EXPECTED_RUNS are kept, the oldest forgotten first."""
    hub = quiet_hub
    monkeypatch.setattr(hub_module, "EXPECTED_RUNS", 2)
    runs = [str(uuid.uuid4()) for _ in range(3)]
    for run_id in runs:
        hub.expect(event(run_id, 1, "run.created"))
        hub.publish([event(run_id, 2)])
    assert list(hub._expected) == runs[1:]
