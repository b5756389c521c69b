"""The event hub: one LISTEN connection per API process, fanning run events out to SSE clients.

A worker's tick sends one NOTIFY naming the runs with new events. The hub fetches them for every
followed run in one query and hands each row to that run's subscribers. The workers of its own
process (`threadline serve`) hand it their committed rows directly (publish): those are not
read back, only the other processes' are. A subscriber first
catches up from the table (replay), then takes live rows, skipping what it has and refilling
any gap from the table: every event exactly once, in order, on any API instance. It ends with
the run: after the terminal event, or once the run is seen to be over with nothing left to send.

A subscriber's buffer is bounded (SUBSCRIBER_BUFFER rows): a client that stops reading stops
its follower, whose buffer fills; the rows past it are dropped and the follower refills them
from the table once its client reads again. A stalled stream holds at most that many rows (and
what its socket buffers hold), and never slows the others: rows are handed out without waiting.

A database outage does not end a follower: its reads are retried with backoff (the SSE response
keeps the client's connection open with its heartbeats meanwhile), and the LISTEN connection is
made again, after which everything followed is fetched; the stream goes on where it was, every
event still exactly once. Only an outage longer than `outage_seconds` ends it, with the error:
the client reconnects with Last-Event-ID, and loses nothing either.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import Counter
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import asyncpg
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.db.engine import autocommit
from app.db.outage import database_unavailable
from app.eventlog import store as event_store
from app.eventlog.registry import TERMINAL_EVENTS

log = logging.getLogger(__name__)
PAGE = 1000
# Waits between attempts while the database is unreachable: doubling, up to the maximum.
RETRY_FIRST_SECONDS = 0.25
RETRY_MAX_SECONDS = 5.0
OUTAGE_SECONDS = 300.0  # how long a follower waits for the database before giving up
# Live rows buffered per subscriber; past it they are dropped, and read from the table later.
SUBSCRIBER_BUFFER = 256
# A follower that hears nothing reads the table after poll_seconds, then after twice as long
# each time, up to this: a thousand streams waiting on a slow model must not become hundreds
# of reads a second (nothing is missed meanwhile: a live row, or a reconnected LISTEN, ends
# the wait at once).
POLL_MAX_SECONDS = 30.0
# Runs handed to this process's workers whose streams are about to follow them (expect), and
# how many of each one's first rows are kept until its stream subscribes. An expectation no
# stream takes (its client left first) is forgotten once this many newer ones are made.
EXPECTED_RUNS = 1000
EXPECTED_ROWS = 64


def poll_wait(first: float, idle_reads: int) -> float:
    """How long a follower waits for a live row after `idle_reads` reads that brought none."""
    grown: float = first * 2.0 ** min(idle_reads, 16)
    return max(first, min(grown, POLL_MAX_SECONDS))


def _backoff() -> Iterator[float]:
    delay = RETRY_FIRST_SECONDS
    while True:
        yield delay
        delay = min(delay * 2, RETRY_MAX_SECONDS)


class _Subscriber:
    """One follower's buffer of live rows, bounded: what does not fit is dropped, and noted."""

    def __init__(self, size: int) -> None:
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=size)
        self.overflowed = False  # rows were dropped: the table has them
        self.idle_reads = 0  # table reads since the last live row (see poll_wait)

    def offer(self, row: dict[str, Any]) -> None:
        try:
            self.queue.put_nowait(row)
        except asyncio.QueueFull:
            self.overflowed = True


@dataclass
class _Feed:
    subscribers: set[_Subscriber] = field(default_factory=set)
    cursor: int = 0  # the highest seq fetched and handed out for this run
    positioned: int = 0  # subscribers past their replay (the others read the table anyway)
    # The highest seq announced while no fetch was needed yet: none positioned, or this
    # process committing the run's events (it hands them out itself: publish).
    deferred: int = 0


@dataclass
class _Expected:
    """A run's rows published before its stream subscribed, from its first event on."""

    rows: list[dict[str, Any]]
    complete: bool = True  # every row published so far is here, in seq order

    def add(self, row: dict[str, Any]) -> None:
        if not self.complete or row["seq"] <= self.rows[-1]["seq"]:
            return
        if row["seq"] == self.rows[-1]["seq"] + 1 and len(self.rows) < EXPECTED_ROWS:
            self.rows.append(row)
        else:  # a gap, or too many: its stream reads the table, as any other
            self.complete = False


class Listener(Protocol):
    """Another channel heard on the hub's LISTEN connection (app/services/key_cache.py): told
    when LISTEN is in place (what was announced before is unknown), when it is lost (nothing
    is heard until it is back), and each notification's payload."""

    channel: str

    def connected(self) -> None: ...

    def disconnected(self) -> None: ...

    def notified(self, payload: str) -> None: ...


def _handing_to(listener: Listener) -> Callable[[object, int, str, str], None]:
    def notified(_conn: object, _pid: int, _channel: str, payload: str) -> None:
        listener.notified(payload)

    return notified


class EventHub:
    def __init__(
        self,
        engine: AsyncEngine,
        libpq_url: str,
        poll_seconds: float = 2.0,
        outage_seconds: float = OUTAGE_SECONDS,
        subscriber_buffer: int = SUBSCRIBER_BUFFER,
        listeners: Sequence[Listener] = (),
    ) -> None:
        self._buffer = subscriber_buffer
        self._listeners = tuple(listeners)
        self._engine = engine
        self._url = libpq_url
        self._poll = poll_seconds
        self._outage_seconds = outage_seconds
        self._feeds: dict[str, _Feed] = {}
        self._expected: dict[str, _Expected] = {}  # oldest first
        self._listener: asyncpg.Connection | None = None
        self._wanted: dict[str, int] | None = {}  # runs to fetch; None: all of them
        self._local: Counter[str] = Counter()  # runs whose events this process is committing
        self._fetch_needed = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._listen(), name="event-hub-listen"),
            asyncio.create_task(self._fetch_loop(), name="event-hub-fetch"),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        if self._listener is not None:
            with contextlib.suppress(Exception):
                await self._listener.close()

    async def has_more(self, run_id: str, after_seq: int) -> bool:
        """Whether following from `after_seq` would send anything: False when the run is over
        and has no event after it (the client has the terminal event, or the events were
        pruned), so that an SSE response is never opened just to be closed."""
        backlog = await self._read(run_id, after_seq, limit=1)
        return bool(backlog.rows) or not backlog.ended

    async def follow(self, run_id: str, after_seq: int = 0) -> AsyncGenerator[dict[str, Any], None]:
        """The run's events after `after_seq`, replayed then live. Ends after its terminal
        event, or as soon as the run is seen to be over without one left to send: a follower
        never outlives its run, whatever its resume point and whether or not events remain."""
        async with contextlib.aclosing(self.follow_batches(run_id, after_seq)) as batches:
            async for rows in batches:
                for row in rows:
                    yield row

    async def follow_batches(
        self, run_id: str, after_seq: int = 0
    ) -> AsyncGenerator[list[dict[str, Any]], None]:
        """follow's events, as they come: a page of the table at once (a replay, or a follower
        catching up after its client stalled), a live row alone. An SSE response sends each
        batch in one write."""
        after_seq = min(after_seq, event_store.MAX_EVENT_SEQ)  # a cursor the fetch query can bind
        subscriber = _Subscriber(self._buffer)
        # An expected run's replay is what its worker published here so far: no read.
        expected = self._expected.pop(run_id, None)
        if expected is not None and not (
            expected.complete and after_seq == 0 and run_id not in self._feeds
        ):
            expected = None
        cursor = expected.rows[-1]["seq"] if expected is not None else after_seq
        feed = self._feeds.setdefault(run_id, _Feed(cursor=cursor))
        feed.subscribers.add(subscriber)  # before the replay: nothing committed later is missed
        last, positioned = after_seq, expected is not None  # an expected feed is where it is
        feed.positioned += positioned
        try:
            backlog = (
                event_store.Backlog(expected.rows, ended=False, last_seq=cursor)
                if expected is not None
                else await self._read_through_outages(run_id, last)
            )
            while True:
                batch = list(backlog.rows)
                ending = next(
                    (i for i, r in enumerate(batch) if r["type"] in TERMINAL_EVENTS), None
                )
                if ending is not None:
                    del batch[ending + 1 :]
                if batch:
                    yield batch
                    last = batch[-1]["seq"]
                if ending is not None:
                    return
                if len(backlog.rows) == PAGE:  # more in the table
                    backlog = await self._read_through_outages(run_id, last)
                    continue
                if backlog.ended:  # read once the run was over: that was all of it
                    return
                if not positioned:
                    # The feed fetches after what exists, never after a resume point past the
                    # run's last event: it would skip the events up to it, the terminal one
                    # among them. Moved back, it fetches again what it may have skipped.
                    cursor = max(feed.cursor, last)
                    feed.cursor = min(cursor, backlog.last_seq)
                    if feed.cursor < cursor:
                        self._want({run_id: cursor})
                    positioned = True
                    feed.positioned += 1
                    self._undefer(run_id)  # announced during the replay, after its read
                backlog = await self._next(subscriber, run_id, last)
        finally:
            feed.subscribers.discard(subscriber)
            feed.positioned -= positioned
            if not feed.subscribers and self._feeds.get(run_id) is feed:
                del self._feeds[run_id]

    async def _next(self, subscriber: _Subscriber, run_id: str, last: int) -> event_store.Backlog:
        """What comes after `last`: the next live row, or the table's backlog when rows were
        skipped (dropped from a full buffer, too) or nothing arrived for a while (a lost
        notification, or a run that ended without an event this follower is owed, must not
        keep the stream open)."""
        while True:
            if subscriber.overflowed and subscriber.queue.empty():
                subscriber.overflowed = False  # rows arriving from now on are kept again
                return await self._read_through_outages(run_id, last)
            try:
                # Not wait_for: that wraps the get in a task of its own, for every row.
                async with asyncio.timeout(poll_wait(self._poll, subscriber.idle_reads)):
                    row = await subscriber.queue.get()
            except TimeoutError:
                subscriber.idle_reads += 1
                return await self._read_through_outages(run_id, last)
            subscriber.idle_reads = 0
            if row["seq"] == last + 1:
                return event_store.Backlog([row], ended=False, last_seq=row["seq"])
            if row["seq"] > last:  # a gap: refill it from the table
                return await self._read_through_outages(run_id, last)
            if row["type"] in TERMINAL_EVENTS:  # one it resumed past: the run is over
                return event_store.Backlog([], ended=True, last_seq=row["seq"])

    async def _read(self, run_id: str, after_seq: int, limit: int = PAGE) -> event_store.Backlog:
        async with self._reading() as conn:
            return await event_store.read_backlog(conn, run_id, after_seq, limit)

    @contextlib.asynccontextmanager
    async def _reading(self) -> AsyncIterator[AsyncConnection]:
        """A connection for the hub's reads, in autocommit: no BEGIN and ROLLBACK around them
        (each read is one statement, one snapshot). Behind a transaction pooler, in a
        transaction after all (app/db/engine.autocommit)."""
        async with autocommit(self._engine) as conn:
            yield conn

    async def _read_through_outages(self, run_id: str, after_seq: int) -> event_store.Backlog:
        """_read, tried again with backoff while the database is unreachable (for at most
        outage_seconds; then the error is raised). Other errors are raised at once."""
        deadline = asyncio.get_running_loop().time() + self._outage_seconds
        for delay in _backoff():
            try:
                return await self._read(run_id, after_seq)
            except Exception as exc:
                if not database_unavailable(exc) or asyncio.get_running_loop().time() > deadline:
                    raise
                log.info("run %s: database unavailable, reading again in %g s", run_id, delay)
            await asyncio.sleep(delay)
        raise AssertionError("unreachable: the backoff never ends")

    def expect(self, first: dict[str, Any]) -> None:
        """A run this process's ask has just handed to this process's workers, `first` its
        first event (run.created), which a stream of this process is about to follow from
        its start: the rows published for it until that stream subscribes are kept for it,
        so that its replay reads nothing from the table. Called before the run can start;
        the run's events all come from this process, its worker's, until it ends (another
        worker taking it over makes a gap: its stream then reads the table)."""
        run_id = str(first["run_id"])
        self._expected.pop(run_id, None)
        self._expected[run_id] = _Expected([first])
        while len(self._expected) > EXPECTED_RUNS:
            del self._expected[next(iter(self._expected))]

    def publish(self, rows: list[dict[str, Any]]) -> None:
        """Rows this process's worker has just committed, handed to their followers from
        memory (the NOTIFY that follows finds nothing left to fetch). Only a feed's next row
        (seq = cursor + 1) is: after a gap (events of another transaction whose NOTIFY is not
        read yet) the rest is left to the fetch loop, which reads them from the table. A run
        no one follows yet is kept for its stream if one is expected (expect)."""
        for row in rows:
            feed = self._feeds.get(str(row["run_id"]))
            if feed is None:
                expected = self._expected.get(str(row["run_id"]))
                if expected is not None:
                    expected.add(row)
                continue
            if row["seq"] != feed.cursor + 1:
                continue
            feed.cursor = row["seq"]
            for subscriber in feed.subscribers:
                subscriber.offer(row)

    @contextlib.contextmanager
    def committing(self, run_ids: Collection[str]) -> Iterator[None]:
        """Around this process's commit of these runs' events and its publish: a NOTIFY of
        theirs heard meanwhile is not fetched (the publish hands the rows out), unless the
        publish left the feed behind it (the commit failed after all, or a gap)."""
        runs = Counter(iter(run_ids))  # a mapping's keys, not its values as counts
        self._local.update(runs)
        try:
            yield
        finally:
            self._local.subtract(runs)
            for run_id in runs:
                if self._local[run_id] <= 0:
                    del self._local[run_id]
                    self._undefer(run_id)

    def _undefer(self, run_id: str) -> None:
        """Fetch what was announced for the run while no fetch was needed, if that is still
        ahead of its feed."""
        feed = self._feeds.get(run_id)
        if feed is None or not feed.positioned or run_id in self._local:
            return
        deferred, feed.deferred = feed.deferred, 0
        if deferred > feed.cursor:
            self._want({run_id: deferred})

    def _on_notify(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        try:
            message = json.loads(payload)
        except ValueError:
            message = {"all": True}
        self._want(None if message.get("all") else message.get("runs", {}))

    def _want(self, runs: dict[str, int] | None) -> None:
        """Have the fetch loop fetch these runs' events up to these seqs (None: every run's)."""
        if runs is None or self._wanted is None:
            self._wanted = None
        else:
            for run, seq in runs.items():
                self._wanted[run] = max(seq, self._wanted.get(run, 0))
        self._fetch_needed.set()

    async def _fetch_loop(self) -> None:
        while True:
            await self._fetch_needed.wait()
            self._fetch_needed.clear()
            wanted, self._wanted = self._wanted, {}
            cursors = {}
            for run, followed in self._feeds.items():
                if not followed.subscribers:
                    continue
                if wanted is None:  # after a reconnect: every feed, whatever it waits for
                    cursors[run] = followed.cursor
                    continue
                seq = wanted.get(run, 0)
                if seq <= followed.cursor:
                    continue
                if not followed.positioned or run in self._local:
                    followed.deferred = max(followed.deferred, seq)
                    continue
                cursors[run] = followed.cursor
            if not cursors:
                continue
            try:
                async with self._reading() as conn:
                    rows = await event_store.read_events_of_runs(conn, cursors)
            except Exception as exc:
                if database_unavailable(exc):  # followers poll meanwhile; LISTEN refetches
                    log.warning("fetching run events failed: the database is unavailable")
                else:
                    log.exception("fetching run events failed")
                self._wanted = None  # try everything again on the next wake
                continue
            for found in rows:
                feed = self._feeds.get(str(found["run_id"]))
                if feed is None or found["seq"] <= feed.cursor:
                    continue
                feed.cursor = found["seq"]
                row = dict(found)  # one per row, shared by its followers (as publish does)
                for subscriber in feed.subscribers:
                    subscriber.offer(row)

    async def _listen(self) -> None:
        """Keep one LISTEN connection; after any reconnect, fetch everything followed. While
        the database is unreachable, try again with backoff (followers poll the table)."""
        delays = _backoff()
        while True:
            try:
                lost = asyncio.Event()
                self._listener = await asyncpg.connect(self._url)
                self._listener.add_termination_listener(lambda _conn, lost=lost: lost.set())
                await self._listener.add_listener(event_store.CHANNEL, self._on_notify)
                for listener in self._listeners:
                    await self._listener.add_listener(listener.channel, _handing_to(listener))
                    listener.connected()
                delays = _backoff()  # connected: the next loss starts over from the first wait
                self._want(None)
                await lost.wait()
                log.warning("event hub LISTEN connection lost; reconnecting")
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if database_unavailable(exc):
                    log.warning("event hub LISTEN connection failed: the database is unavailable")
                else:
                    log.exception("event hub LISTEN connection failed; reconnecting")
            finally:
                for listener in self._listeners:
                    listener.disconnected()
                if self._listener is not None:
                    with contextlib.suppress(Exception):
                        await self._listener.close()
            await asyncio.sleep(next(delays))
