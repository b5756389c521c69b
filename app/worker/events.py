"""Group commit of run events: one multi-row INSERT and one NOTIFY per tick for all the runs a
worker process is executing. Text deltas queued in one tick are coalesced into one event; the
first delta of a run is flushed at once, so the first token is never held back a tick."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from app.db import events as events_db

log = logging.getLogger(__name__)
DELTA = "message.delta"


class EventWriter:
    def __init__(self, engine: AsyncEngine, tick_seconds: float = 0.05) -> None:
        self._engine = engine
        self._tick = tick_seconds
        self._pending: dict[str, list[dict[str, Any]]] = {}
        self._next: dict[str, int] = {}
        self._wake = asyncio.Event()
        self._flushing = asyncio.Lock()
        self._first_delta_sent: set[str] = set()

    def open(self, run_id: str, next_seq: int) -> None:
        self._next[run_id] = next_seq
        self._pending.setdefault(run_id, [])

    def emit(self, run_id: str, kind: str, data: dict[str, Any], *, urgent: bool = False) -> None:
        queue = self._pending.setdefault(run_id, [])
        if kind == DELTA and queue and queue[-1]["type"] == DELTA:
            queue[-1]["data"]["text"] += data["text"]  # coalesced: one event, one seq
            return
        queue.append(
            {"run_id": run_id, "seq": self._next[run_id], "type": kind, "data": dict(data)}
        )
        self._next[run_id] += 1
        if urgent or (kind == DELTA and run_id not in self._first_delta_sent):
            self._first_delta_sent.add(run_id)
            self._wake.set()

    def next_seq(self, run_id: str) -> int:
        return self._next[run_id]

    def close(self, run_id: str) -> None:
        self._next.pop(run_id, None)
        self._pending.pop(run_id, None)
        self._first_delta_sent.discard(run_id)

    async def flush(self) -> None:
        async with self._flushing:
            batch = {run: rows for run, rows in self._pending.items() if rows}
            if not batch:
                return
            for run in batch:
                self._pending[run] = []
            rows = [row for run_rows in batch.values() for row in run_rows]
            try:
                async with self._engine.begin() as conn:
                    await events_db.insert_events(conn, rows)
                    await events_db.notify(
                        conn, {run: run_rows[-1]["seq"] for run, run_rows in batch.items()}
                    )
            except Exception:
                # Put them back in front: the next tick tries again, seqs unchanged.
                for run, run_rows in batch.items():
                    self._pending[run] = run_rows + self._pending.get(run, [])
                raise

    async def run(self) -> None:
        """Flush every tick (or at once when woken) until cancelled."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=self._tick)
            self._wake.clear()
            try:
                await self.flush()
            except Exception:
                log.exception("flushing run events failed; retrying next tick")
