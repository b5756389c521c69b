"""Request dependencies: the engine, the settings, and the caller's tenant."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.ext.asyncio import AsyncEngine

from app.api.hub import EventHub
from app.config import Settings
from app.services.keys import tenant_for_key
from app.worker.handoff import Handoff

_bearer = HTTPBearer(auto_error=False, description="An API key: `threadline keys create`.")


def get_engine(request: Request) -> AsyncEngine:
    engine: AsyncEngine = request.app.state.engine
    return engine


def get_handoff(request: Request) -> Handoff | None:
    """The workers of this process (`threadline serve`), to start its asks' runs at once."""
    handoff: Handoff | None = request.app.state.handoff
    return handoff


def get_hub(request: Request) -> EventHub:
    hub: EventHub = request.app.state.hub
    return hub


def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def get_tenant(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> str:
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise HTTPException(
            401, "send Authorization: Bearer <api key>", {"WWW-Authenticate": "Bearer"}
        )
    tenant_id = await tenant_for_key(get_engine(request), credentials.credentials)
    if tenant_id is None:
        raise HTTPException(401, "unknown or revoked API key", {"WWW-Authenticate": "Bearer"})
    return tenant_id


Engine = Annotated[AsyncEngine, Depends(get_engine)]
Config = Annotated[Settings, Depends(get_settings)]
Tenant = Annotated[str, Depends(get_tenant)]
Hub = Annotated[EventHub, Depends(get_hub)]
LocalWorkers = Annotated[Handoff | None, Depends(get_handoff)]
IdempotencyKey = Annotated[
    str | None,
    Header(
        min_length=1,
        max_length=255,
        description="A retried request with the same key returns the run the first one created.",
    ),
]
