"""The one way run events are written: `append` inside a caller's transaction, or `EventWriter`,
the group commit of a worker process (one multi-row INSERT and one NOTIFY per tick for all the
runs it executes). Both end in app/eventlog/store.append_events, which allocates the seqs."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Collection, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.db.engine import autocommit
from app.eventlog import store as event_store
from app.eventlog.registry import Event, EventType

log = logging.getLogger(__name__)
DELTA = EventType.MESSAGE_DELTA
REASONING = EventType.REASONING_DELTA


class LocalFollowers(Protocol):
    """This process's followers of run events (`threadline serve`: the API's event hub)."""

    def publish(self, rows: list[dict[str, Any]]) -> None:
        """Rows ({run_id, seq, type, data}) just committed, handed out from memory."""
        ...

    def committing(self, run_ids: Collection[str]) -> AbstractContextManager[None]:
        """Around a commit of these runs' events and the publish that follows it: their
        NOTIFY, heard meanwhile, need not be read back from the table."""
        ...

    def expect(self, first: dict[str, Any]) -> None:
        """A run about to be executed here, which a stream of this process follows from its
        first event (`first`): what is published for it before the stream subscribes is kept
        for it."""
        ...


async def append(
    conn: AsyncConnection,
    run_id: str,
    events: Sequence[Event],
    written: list[dict[str, Any]] | None = None,
) -> int:
    """Append a run's events in the caller's transaction, announced when it commits; returns
    the run's last seq (0 when there were none). `written` is given the rows, for the caller
    to hand to its process's followers once the transaction has committed (publish)."""
    rows = [(run_id, kind, data) for kind, data in events]
    last = await event_store.append_events(conn, rows)
    if written is not None:
        written += event_store.numbered(rows, last)
    return last.get(run_id, 0)


def _same_open_block(queued: Event, data: dict[str, Any]) -> bool:
    """A reasoning piece that continues the queued one's block (not yet ended)."""
    kind, earlier = queued
    return (
        kind == REASONING
        and earlier["index"] == data["index"]
        and not earlier.get("end")
        and not data.get("start")
        and not data.get("redacted")
    )


class EventWriter:
    """Buffers the events of the runs a worker executes and commits them every tick. Text
    deltas queued in one tick are coalesced into one event; the first delta of a run is
    flushed at once, so the first token is never held back a tick. Reasoning deltas of one
    block are coalesced likewise.

    With `followers` (`threadline serve`: the API's event hub), each tick's rows are handed to
    this process's followers from memory once committed, besides the NOTIFY that tells every
    other process to read them from the table."""

    def __init__(
        self,
        engine: AsyncEngine,
        tick_seconds: float = 0.05,
        followers: LocalFollowers | None = None,
    ) -> None:
        self._engine = engine
        self._tick = tick_seconds
        self._followers = followers
        self._pending: dict[str, list[Event]] = {}
        self._wake = asyncio.Event()
        self._flushing = asyncio.Lock()
        self._taken = 0  # batches taken from _pending so far (each one committed, or put back)
        self._committed = 0  # of those, committed
        self._first_delta_sent: set[str] = set()
        self._attempts: dict[str, int] = {}  # the attempt each open run is at, here
        self.superseded: set[str] = set()  # runs whose attempt here was taken over

    def open(self, run_id: str, attempt: int) -> None:
        """Write the run's events as its attempt `attempt`: fenced once another one starts."""
        self._attempts[run_id] = attempt
        self.superseded.discard(run_id)

    def emit(
        self, run_id: str, kind: EventType, data: dict[str, Any], *, urgent: bool = False
    ) -> None:
        queue = self._pending.setdefault(run_id, [])
        if kind == DELTA and queue and queue[-1][0] == DELTA:
            queue[-1][1]["text"] += data["text"]  # coalesced: one event
            return
        if kind == REASONING and queue and _same_open_block(queue[-1], data):
            queue[-1][1]["text"] += data["text"]  # coalesced within its block
            if data.get("end"):
                queue[-1][1]["end"] = True
            return
        queue.append((kind, dict(data)))
        if urgent or (kind == DELTA and run_id not in self._first_delta_sent):
            self._first_delta_sent.add(run_id)
            self._wake.set()

    def close(self, run_id: str) -> None:
        """Forget a run that has ended here (its events were flushed with its end)."""
        self._pending.pop(run_id, None)
        self._first_delta_sent.discard(run_id)
        self._attempts.pop(run_id, None)
        self.superseded.discard(run_id)

    async def flush(self) -> None:
        """Commit every event emitted so far (and whatever else is pending by then). Callers
        that flush at once share one commit (a group commit): a hundred runs ending in the
        same tick cost one round trip, not a hundred in a row."""
        wanted = self._taken + 1  # the first batch taken from now on holds what is pending
        while self._committed < wanted:
            async with self._flushing:
                if self._committed < wanted:
                    await self._commit_pending()

    async def _commit_pending(self) -> None:
        """Take what is pending and commit it: one statement (INSERT and NOTIFY) on an
        autocommit connection, one round trip. Called under the flushing lock."""
        batch = {run: events for run, events in self._pending.items() if events}
        self._taken += 1
        if not batch:
            self._committed = self._taken
            return
        for run in batch:
            self._pending[run] = []
        rows = [(run, kind, data) for run, events in batch.items() for kind, data in events]
        attempts = {run: self._attempts.get(run, 0) for run in batch}
        try:
            with self.committing(list(batch)):
                async with autocommit(self._engine) as conn:
                    last = await event_store.append_events(conn, rows, attempts)
                    await conn.commit()  # behind a transaction pooler, autocommit is not set
                    self._committed = self._taken
                    self._committed_rows(rows, last)
        except Exception:
            if self._committed == self._taken:
                raise  # written: only giving the connection back failed
            # Put them back in front: the next tick tries again, in the same order.
            for run, events in batch.items():
                self._pending[run] = events + self._pending.get(run, [])
            self._taken -= 1
            raise

    def _committed_rows(
        self, rows: list[tuple[str, EventType, dict[str, Any]]], last: dict[str, int]
    ) -> None:
        for run in {run for run, _, _ in rows} - last.keys():
            log.warning("run %s was taken over by another attempt: its events here dropped", run)
            self.superseded.add(run)
        self.publish(event_store.numbered(rows, last))

    def publish(self, rows: list[dict[str, Any]]) -> None:
        """Hand committed rows ({run_id, seq, type, data}) to this process's followers: each
        tick's, and those other transactions of this process committed (a run's start, its
        end), inside `committing`."""
        if self._followers is not None:
            try:
                self._followers.publish(rows)
            except Exception:  # followers read the table instead: nothing is lost
                log.exception("handing committed events to local followers failed")

    def expect(self, first: dict[str, Any]) -> None:
        """A run this process executes next, streamed from here (LocalFollowers.expect)."""
        if self._followers is not None:
            self._followers.expect(first)

    def committing(self, run_ids: Collection[str]) -> AbstractContextManager[None]:
        """Around a commit of these runs' events and its publish (LocalFollowers.committing)."""
        if self._followers is None:
            return contextlib.nullcontext()
        return self._followers.committing(run_ids)

    async def run(self) -> None:
        """Flush every tick (or at once when woken) until cancelled. Ticks keep their rate
        whatever a flush takes: a flush that took part of a tick shortens the wait to the next
        one, and one that took longer is followed at once (each then carries more: the deltas
        of a run pending meanwhile are coalesced into one event)."""
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            self._wake.clear()
            try:
                await self.flush()
            except Exception:
                log.exception("flushing run events failed; retrying next tick")
            remaining = started + self._tick - loop.time()
            if remaining > 0 and not self._wake.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(remaining):
                        await self._wake.wait()
