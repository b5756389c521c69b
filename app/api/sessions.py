"""Routes for sessions: create, list, read, update, delete, fork."""

from __future__ import annotations

from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Query, Response

from app.api.bodies import JSONRoute
from app.api.deps import Config, Engine, Tenant
from app.api.errors import error_responses
from app.api.schemas import ForkRequest, Session, SessionCreate, SessionList, SessionPatch
from app.services import agents
from app.services import sessions as service
from app.services.errors import Invalid

router = APIRouter(prefix="/v1/sessions", tags=["sessions"], route_class=JSONRoute)


@router.post(
    "",
    operation_id="createSession",
    status_code=201,
    responses=error_responses(400, 401, 404, 413, 422),
)
async def create_session(
    body: SessionCreate, engine: Engine, tenant: Tenant, settings: Config
) -> Session:
    pin = await agents.pin_for(engine, tenant, body.agent) if body.agent is not None else None
    session = await service.create_session(
        engine,
        tenant,
        agent=pin,
        title=body.title,
        metadata=body.metadata,
        config=body.config.model_dump(mode="json", exclude_none=True),
        settings=settings,
        ttl_seconds=body.ttl_seconds,
        expires_at=body.expires_at,
    )
    return Session.of(session)


@router.get("", operation_id="listSessions", responses=error_responses(401, 422))
async def list_sessions(
    engine: Engine,
    tenant: Tenant,
    settings: Config,
    limit: Annotated[int, Query(ge=1, le=1000)] = 20,
    cursor: Annotated[str | None, Query(max_length=512)] = None,
    metadata: Annotated[
        list[str] | None,
        Query(description="key:value, repeatable; sessions must match all of them."),
    ] = None,
    q: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=200,
            description="Only sessions whose title contains this text (case-insensitive).",
        ),
    ] = None,
    parent_id: Annotated[
        UUID | None, Query(description="Only the forks of this session (its branches).")
    ] = None,
) -> SessionList:
    if limit > settings.max_page_size:
        raise Invalid(
            "limit_too_large",
            f"limit may be at most {settings.max_page_size}",
            {"loc": ["query", "limit"], "max": settings.max_page_size},
        )
    page = await service.list_sessions(
        engine,
        tenant,
        limit=limit,
        cursor=cursor,
        metadata=_parse_filter(metadata or []),
        title_contains=q,
        parent_id=str(parent_id) if parent_id is not None else None,
    )
    return SessionList(
        data=[Session.of(s) for s in page.items],
        has_more=page.next_cursor is not None,
        next_cursor=page.next_cursor,
    )


@router.get("/{session_id}", operation_id="getSession", responses=error_responses(401, 404, 422))
async def get_session(session_id: UUID, engine: Engine, tenant: Tenant) -> Session:
    return Session.of(await service.get_session(engine, tenant, str(session_id)))


@router.patch(
    "/{session_id}",
    operation_id="updateSession",
    responses=error_responses(400, 401, 404, 413, 422),
)
async def update_session(
    session_id: UUID, body: SessionPatch, engine: Engine, tenant: Tenant, settings: Config
) -> Session:
    changes = body.model_dump(mode="json", exclude_unset=True)
    if "expires_at" in changes:
        changes["expires_at"] = body.expires_at  # the datetime, not its JSON string
    if body.config is not None:
        changes["config"] = body.config.model_dump(mode="json", exclude_unset=True)
    if changes.get("metadata") is None:
        changes.pop("metadata", None)
    if changes.get("config") is None:
        changes.pop("config", None)
    session = await service.update_session(engine, tenant, str(session_id), changes, settings)
    return Session.of(session)


@router.delete(
    "/{session_id}",
    operation_id="deleteSession",
    status_code=204,
    responses=error_responses(401, 404, 422),
)
async def delete_session(session_id: UUID, engine: Engine, tenant: Tenant) -> Response:
    await service.delete_session(engine, tenant, str(session_id))
    return Response(status_code=204)


@router.post(
    "/{session_id}/fork",
    operation_id="forkSession",
    status_code=201,
    responses=error_responses(400, 401, 404, 409, 413, 422),
)
async def fork_session(
    session_id: UUID,
    engine: Engine,
    tenant: Tenant,
    settings: Config,
    body: ForkRequest | None = None,
) -> Session:
    body = body or ForkRequest()
    session = await service.fork_session(
        engine,
        tenant,
        str(session_id),
        at_seq=body.at_seq,
        title=body.title,
        metadata=body.metadata,
        settings=settings,
    )
    return Session.of(session)


def _parse_filter(pairs: list[str]) -> dict[str, str]:
    parsed: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition(":")
        if not sep or not key:
            raise Invalid(
                "invalid_metadata_filter",
                f"metadata filter {pair!r} is not key:value",
                {"loc": ["query", "metadata"]},
            )
        parsed[key] = value
    return parsed
