"""What a worker process shares among its jobs: engine, settings, model router, event writer."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncEngine

from app.config import Settings
from app.llm.router import Router
from app.worker.events import EventWriter


@dataclass
class Runtime:
    engine: AsyncEngine
    settings: Settings
    router: Router
    writer: EventWriter


_current: Runtime | None = None


def install(runtime: Runtime | None) -> None:
    """procrastinate calls tasks as plain functions; they find their process's runtime here."""
    global _current
    _current = runtime


def current() -> Runtime:
    if _current is None:
        raise RuntimeError("no worker runtime in this process")
    return _current
