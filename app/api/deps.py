"""Request dependencies: the engine, the settings, and the caller's tenant."""

from __future__ import annotations

import hmac
import time
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Header, HTTPException, Request
from fastapi.security import APIKeyQuery, HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.ext.asyncio import AsyncEngine

from app.api.errors import Refusal
from app.config import Settings
from app.core.runs import Run
from app.core.stream_tokens import ExpiredToken, InvalidToken, StreamGrant, verify
from app.eventlog.hub import EventHub
from app.services.errors import Forbidden
from app.services.handoff import RunHandoff
from app.services.key_cache import KeyCache
from app.services.keys import Caller, authenticate
from app.services.quotas import Limits, rate_limited
from app.telemetry import logging as log_ids

_bearer = HTTPBearer(auto_error=False, description="An API key: `threadline keys create`.")
_admin_bearer = HTTPBearer(
    auto_error=False,
    scheme_name="AdminKey",
    description="The admin key (THREADLINE_ADMIN_KEY), for /v1/admin routes only.",
)
# The methods a read-only key may call (and the routes taking a ReadingTenant, which only read
# whatever their method: a dry-run projection, a token to read streams with).
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_stream_token = APIKeyQuery(
    name="token",
    scheme_name="StreamToken",
    auto_error=False,
    description="A short-lived stream token (POST /v1/stream_tokens) as `?token=`, for "
    "clients that cannot send Authorization (a browser's EventSource). Stream endpoints only.",
)


# The accessors below are `async def` although they never wait: FastAPI runs a plain `def`
# dependency in its threadpool, a thread hop on every request.


async def get_engine(request: Request) -> AsyncEngine:
    engine: AsyncEngine = request.app.state.engine
    return engine


async def get_handoff(request: Request) -> RunHandoff | None:
    """The workers of this process (`threadline serve`), to start its asks' runs at once."""
    handoff: RunHandoff | None = request.app.state.handoff
    return handoff


async def get_hub(request: Request) -> EventHub:
    hub: EventHub = request.app.state.hub
    return hub


async def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


@dataclass(frozen=True)
class Served:
    """What this process serves an ask with, as one dependency (each one a route resolves
    costs it, and an ask is the hot route): the engine, the settings, the event hub and this
    process's workers (get_handoff)."""

    engine: AsyncEngine
    settings: Settings
    hub: EventHub
    handoff: RunHandoff | None


async def get_served(request: Request) -> Served:
    state = request.app.state
    return Served(state.engine, state.settings, state.hub, state.handoff)


async def get_key_cache(request: Request) -> KeyCache | None:
    return getattr(request.app.state, "key_cache", None)


KnownKeys = Annotated[KeyCache | None, Depends(get_key_cache)]


async def get_caller(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Caller:
    """The caller's key, from this process's key cache or the database, and the request
    counted where the tenant has a requests-per-minute limit (over it: 429 rate_limited). A
    revoked key is refused by every process as soon as the database's notification of it
    arrives (app/services/key_cache.py)."""
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise HTTPException(
            401, "send Authorization: Bearer <api key>", {"WWW-Authenticate": "Bearer"}
        )
    caller = await authenticate(
        await get_engine(request),
        credentials.credentials,
        (await get_settings(request)).default_rpm,
        await get_key_cache(request),
    )
    if caller is None:
        raise HTTPException(401, "unknown or revoked API key", {"WWW-Authenticate": "Bearer"})
    if caller.over_rate:
        assert caller.rpm_limit is not None and caller.rpm_count is not None
        assert caller.window_start is not None and caller.retry_after is not None
        raise rate_limited(
            caller.rpm_limit, caller.rpm_count, caller.window_start, caller.retry_after
        )
    params = request.path_params
    log_ids.bind(
        tenant_id=caller.tenant_id,
        session_id=params.get("session_id"),
        run_id=params.get("run_id"),
    )
    return caller


async def get_reading_tenant(caller: Annotated[Caller, Depends(get_caller)]) -> str:
    """The tenant, for a route that only reads whatever its method (read-only keys welcome)."""
    return caller.tenant_id


async def get_tenant(request: Request, caller: Annotated[Caller, Depends(get_caller)]) -> str:
    """The tenant; a read-only key may only read (403 read_only_key otherwise)."""
    if caller.read_only and request.method not in READ_METHODS:
        raise Forbidden(
            "read_only_key",
            "this API key is read-only: it cannot change anything",
            {"method": request.method},
        )
    return caller.tenant_id


async def get_own_limits(caller: Annotated[Caller, Depends(get_caller)]) -> Limits:
    """The tenant's own limits, as the request's key lookup read them (an ask's quota check
    needs them: not read a second time)."""
    return caller.limits


async def require_admin(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_admin_bearer)],
) -> None:
    """The admin key (THREADLINE_ADMIN_KEY); unset, the admin API does not exist (404 to any
    key)."""
    challenge = {"WWW-Authenticate": "Bearer"}
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise HTTPException(401, "send Authorization: Bearer <admin key>", challenge)
    configured = (await get_settings(request)).admin_key
    if configured is None:
        raise Refusal(404, "admin_api_disabled", "the admin API is off: set THREADLINE_ADMIN_KEY")
    if not hmac.compare_digest(credentials.credentials.encode(), configured.encode()):
        raise HTTPException(401, "not the admin key", challenge)


async def stream_token_secret(request: Request) -> bytes:
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
        return StreamReader((await get_caller(request, credentials)).tenant_id)
    assert token is not None
    try:
        grant = verify(await stream_token_secret(request), token, time.time())
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
ReadingTenant = Annotated[str, Depends(get_reading_tenant)]
OwnLimits = Annotated[Limits, Depends(get_own_limits)]
Hub = Annotated[EventHub, Depends(get_hub)]
Reader = Annotated[StreamReader, Depends(get_stream_reader)]
LocalWorkers = Annotated[RunHandoff | None, Depends(get_handoff)]
Serving = Annotated[Served, Depends(get_served)]
IdempotencyKey = Annotated[
    str | None,
    Header(
        min_length=1,
        max_length=255,
        description="A retried request with the same key returns the run the first one created.",
    ),
]
