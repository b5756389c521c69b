"""POST /v1/stream_tokens: a short-lived token that opens one session's or one run's streams.

For clients that cannot send Authorization on a stream request: a browser's EventSource. The
API key stays on the server that calls this; the browser gets only the token, in the URL.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from uuid import UUID

from fastapi import APIRouter, Request

from app.api.bodies import JSONRoute
from app.api.deps import Config, Engine, ReadingTenant, stream_token_secret
from app.api.errors import error_responses
from app.api.schemas import DEFAULT_STREAM_TOKEN_SECONDS, StreamToken, StreamTokenRequest
from app.core.stream_tokens import ScopeKind, StreamGrant, sign
from app.services import runs as runs_service
from app.services import sessions as sessions_service
from app.services.errors import Invalid

router = APIRouter(prefix="/v1/stream_tokens", tags=["runs"], route_class=JSONRoute)


@router.post(
    "",
    operation_id="createStreamToken",
    status_code=201,
    responses=error_responses(400, 401, 404, 413, 422),
)
async def create_stream_token(
    body: StreamTokenRequest,
    request: Request,
    engine: Engine,
    tenant: ReadingTenant,
    settings: Config,
) -> StreamToken:
    """A token that opens the streams of one session (its active run's, and its runs' events)
    or of one run, as `?token=`, without Authorization, until it expires (minutes). For a
    browser's EventSource: issue it where the API key lives (your backend), hand the browser
    the token. 404 when the session or run is not the caller's."""
    longest = settings.stream_token_max_seconds
    lifetime = body.expires_in or min(DEFAULT_STREAM_TOKEN_SECONDS, longest)
    if lifetime > longest:
        raise Invalid(
            "expires_in_too_long",
            f"expires_in is at most {longest} seconds (THREADLINE_STREAM_TOKEN_MAX_SECONDS)",
            {"max": longest},
        )
    kind: ScopeKind
    if body.session_id is not None:
        kind, scope_id = "session", str(UUID(body.session_id))
        await sessions_service.get_session(engine, tenant, scope_id)  # 404 for others'
        stream_path = f"/v1/sessions/{scope_id}/stream"
    else:
        assert body.run_id is not None
        kind, scope_id = "run", str(UUID(body.run_id))
        await runs_service.get_run(engine, tenant, scope_id)
        stream_path = f"/v1/runs/{scope_id}/events"
    expires_at = int(time.time()) + lifetime
    token = sign(
        await stream_token_secret(request), StreamGrant(tenant, kind, scope_id, expires_at)
    )
    return StreamToken(
        token=token,
        expires_at=datetime.fromtimestamp(expires_at, UTC),
        session_id=scope_id if kind == "session" else None,
        run_id=scope_id if kind == "run" else None,
        stream_url=f"{stream_path}?token={token}",
    )
