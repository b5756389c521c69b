"""The composition root: create_app() wires settings, engine, routes and error handling."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from app.api import entries, health, projection, sessions
from app.api.errors import install_error_handlers
from app.api.limits import BodySizeLimit
from app.config import Settings
from app.db.engine import create_engine

API_VERSION = "0.1.0"


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.engine = create_engine(settings)
        try:
            yield
        finally:
            await app.state.engine.dispose()

    app = FastAPI(
        title="Threadline",
        version=API_VERSION,
        description=(
            "Sessions for LLM chat agents: an append-only journal per session, O(1) forks, "
            "tenant-scoped API keys."
        ),
        lifespan=lifespan,
    )
    app.state.settings = settings
    install_error_handlers(app)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_request_bytes)
    app.include_router(sessions.router)
    app.include_router(entries.router)
    app.include_router(projection.router)
    app.include_router(health.router)
    return app
