"""The composition root: create_app() wires settings, engine, routes and error handling."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from app import heap
from app.api import (
    admin,
    agents,
    asks,
    compaction,
    entries,
    health,
    mcp_servers,
    memory,
    metrics,
    models,
    projection,
    runs,
    schedules,
    search,
    session_files,
    sessions,
    stream_tokens,
    ui_messages,
    usage,
    webhooks,
)
from app.api.docs import install_docs
from app.api.errors import install_error_handlers
from app.api.limits import BodySizeLimit
from app.api.openapi_document import install_document
from app.api.session_files import IMPORT_PATH
from app.api.web import install_web
from app.config import Settings
from app.db.engine import create_engine, libpq_url
from app.eventlog.hub import EventHub
from app.llm.tokenizers import stored_counter
from app.openai_api import routes as openai_routes
from app.services.handoff import RunHandoff
from app.services.key_cache import KeyCache
from app.telemetry import metrics as metric_hooks
from app.telemetry import tracing
from app.telemetry.logging import RequestIds
from app.worker.pool import worker_pool

API_VERSION = "0.1.0"

# What a browser page may send cross-origin (THREADLINE_CORS_ORIGINS), and read of the answers.
CORS_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]
CORS_REQUEST_HEADERS = [
    "Authorization",
    "Content-Type",
    "Idempotency-Key",
    "If-Match",
    "If-None-Match",
    "Last-Event-ID",  # an EventSource's reconnect, or a fetch-based stream resuming
    "X-Request-ID",
]
CORS_EXPOSED_HEADERS = ["ETag", "Retry-After", "WWW-Authenticate", "Allow", "X-Request-ID"]


def create_app(settings: Settings | None = None, *, workers: int = 0) -> FastAPI:
    """The API; with `workers`, also that many run-executing workers in the same process."""
    settings = settings or Settings()
    tracing.configure(settings)  # tracing asked for without the `otel` extra: fails here
    metric_hooks.configure(settings.metrics_enabled)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        assert settings.database_url is not None
        metric_hooks.forget_dead_processes()
        app.state.engine = create_engine(settings)
        # Appends and projections count tokens: load the vocabulary before the first request.
        await asyncio.to_thread(stored_counter)
        # LISTEN needs a session of its own: the hub connects directly, never via a pooler.
        app.state.key_cache = KeyCache()  # kept true by the hub's LISTEN connection
        app.state.hub = EventHub(
            app.state.engine, libpq_url(settings.direct_url), listeners=[app.state.key_cache]
        )
        await app.state.hub.start()
        try:
            if workers:  # `threadline serve`: the worker pool runs in this process too
                pool = worker_pool(settings, workers, app.state.engine, app.state.hub)
                async with pool as handoff:
                    # The asks of every surface hand their runs to it (app/services/handoff.py).
                    local: RunHandoff = handoff
                    app.state.handoff = local
                    heap.settle()
                    yield
            else:
                heap.settle()
                yield
        finally:
            await app.state.hub.stop()
            await app.state.engine.dispose()
            metric_hooks.process_stopped()

    app = FastAPI(
        title="Threadline",
        version=API_VERSION,
        description=(
            "Sessions for LLM chat agents: an append-only journal per session, O(1) forks, "
            "tenant-scoped API keys."
        ),
        lifespan=lifespan,
        docs_url=None,  # install_docs serves them with local assets
        redoc_url=None,
    )
    app.state.settings = settings
    # Unset: a key of this process only (its tokens open streams on this process alone).
    secret = settings.stream_token_secret or secrets.token_urlsafe(32)
    app.state.stream_token_secret = secret.encode()
    app.state.handoff = None  # `threadline serve`: its workers start this process's asks
    install_error_handlers(app)
    install_docs(app)
    app.add_middleware(
        BodySizeLimit,
        max_bytes=settings.max_request_bytes,
        larger={IMPORT_PATH: settings.max_import_bytes},
    )
    if settings.cors_origins:
        # Outermost: every answer gets its CORS headers, refusals (413, 401, ...) included.
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=CORS_METHODS,
            allow_headers=CORS_REQUEST_HEADERS,
            expose_headers=CORS_EXPOSED_HEADERS,
            max_age=600,
        )
    app.add_middleware(tracing.TraceRequests)
    # Outermost: every answer, refusals included, echoes its request id.
    app.add_middleware(RequestIds)
    app.include_router(sessions.router)
    app.include_router(agents.router)
    app.include_router(schedules.router)
    app.include_router(entries.router)
    app.include_router(session_files.router)
    app.include_router(projection.router)
    app.include_router(asks.router)
    app.include_router(runs.router)
    app.include_router(search.router)
    app.include_router(memory.router)
    app.include_router(compaction.router)
    app.include_router(stream_tokens.router)
    app.include_router(ui_messages.router)
    app.include_router(models.router)
    app.include_router(usage.router)
    app.include_router(admin.router)
    app.include_router(openai_routes.router)
    app.include_router(mcp_servers.router)
    app.include_router(webhooks.router)
    app.include_router(health.router)
    app.include_router(metrics.router)
    install_web(app)
    install_document(app, settings)
    return app
