"""Request dependencies: the engine, the settings, and the caller's tenant."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Header, HTTPException, Request
from fastapi.security import APIKeyQuery, HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.ext.asyncio import AsyncEngine

from app.api.errors import Refusal
from app.api.hub import EventHub
from app.config import Settings
from app.core.stream_tokens import ExpiredToken, InvalidToken, StreamGrant, verify
from app.runs.model import Run
from app.services.keys import tenant_for_key
from app.telemetry import logging as log_ids
from app.worker.handoff import Handoff

_bearer = HTTPBearer(auto_error=False, description="An API key: `threadline keys create`.")
_stream_token = APIKeyQuery(
    name="token",
    scheme_name="StreamToken",
    auto_error=False,
    description="A short-lived stream token (POST /v1/stream_tokens) as `?token=`, for "
    "clients that cannot send Authorization (a browser's EventSource). Stream endpoints only.",
)


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
    params = request.path_params
    log_ids.bind(
        tenant_id=tenant_id, session_id=params.get("session_id"), run_id=params.get("run_id")
    )
    return tenant_id


def stream_token_secret(request: Request) -> bytes:
    secret: bytes = request.app.state.stream_token_secret
    return secret


@dataclass(frozen=True)
class StreamReader:
    """Who opens a stream: an API key (any stream of its tenant), or a stream token (the
    streams of one session, or of one run)."""

    tenant_id: str
    grant: StreamGrant | None = None  # None: an API key

    def check_session(self, session_id: str) -> None:
        if self.grant is not None and (self.grant.kind, self.grant.id) != ("session", session_id):
            raise _out_of_scope(self.grant)

    def check_run(self, run: Run) -> None:
        if self.grant is None:
            return
        if (self.grant.kind, self.grant.id) not in {("run", run.id), ("session", run.session_id)}:
            raise _out_of_scope(self.grant)


def _out_of_scope(grant: StreamGrant) -> Refusal:
    return Refusal(
        403, "stream_token_scope", f"this stream token opens the streams of {grant.kind} {grant.id}"
    )


async def get_stream_reader(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    token: Annotated[str | None, Depends(_stream_token)],
) -> StreamReader:
    """An API key (Authorization), else a stream token (`?token=`)."""
    challenge = {"WWW-Authenticate": "Bearer"}
    if credentials is None and token is None:
        raise HTTPException(
            401, "send Authorization: Bearer <api key>, or a stream token as ?token=", challenge
        )
    if credentials is not None:
        return StreamReader(await get_tenant(request, credentials))
    assert token is not None
    try:
        grant = verify(stream_token_secret(request), token, time.time())
    except ExpiredToken:
        raise Refusal(
            401,
            "stream_token_expired",
            "the stream token has expired: ask for a new one",
            challenge,
        ) from None
    except InvalidToken as exc:
        raise Refusal(401, "invalid_stream_token", str(exc), challenge) from None
    return StreamReader(grant.tenant_id, grant)


Engine = Annotated[AsyncEngine, Depends(get_engine)]
Config = Annotated[Settings, Depends(get_settings)]
Tenant = Annotated[str, Depends(get_tenant)]
Hub = Annotated[EventHub, Depends(get_hub)]
Reader = Annotated[StreamReader, Depends(get_stream_reader)]
LocalWorkers = Annotated[Handoff | None, Depends(get_handoff)]
IdempotencyKey = Annotated[
    str | None,
    Header(
        min_length=1,
        max_length=255,
        description="A retried request with the same key returns the run the first one created.",
    ),
]
