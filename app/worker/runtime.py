"""What a worker pool shares among its jobs: engine, settings, model router, event writer."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from sqlalchemy import RowMapping
from sqlalchemy.ext.asyncio import AsyncEngine

from app.config import Settings
from app.eventlog.writer import EventWriter
from app.llm.router import Router
from app.services.compaction import PreparedCompaction, Summary
from app.worker.lease import WorkerLease


@dataclass(frozen=True)
class PendingCompaction:
    """An automatic compaction summarizing (then committing) in its own task."""

    prepared: PreparedCompaction
    task: asyncio.Task[tuple[Summary, RowMapping]]


@dataclass
class Runtime:
    engine: AsyncEngine
    settings: Settings
    router: Router
    writer: EventWriter
    lease: WorkerLease
    # Automatic compactions still summarizing, by session: an ask that stopped waiting for one
    # leaves it running here, and the session's next ask joins it instead of starting another.
    compactions: dict[str, PendingCompaction] = field(default_factory=dict)
