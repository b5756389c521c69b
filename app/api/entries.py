"""Routes for a session's journal: history pages and appends."""

from __future__ import annotations

from typing import Annotated, Literal
from uuid import UUID

from fastapi import APIRouter, Query, Response

from app.api.bodies import JSONRoute
from app.api.deps import Config, Engine, Tenant
from app.api.errors import error_responses
from app.api.schemas import AppendRequest, AppendResponse, Entry, EntryPage
from app.core.entries import MAX_ENTRY_SEQ, EntryKind, NewEntry
from app.services import content_checks
from app.services import journal as service
from app.services.errors import Invalid

router = APIRouter(
    prefix="/v1/sessions/{session_id}/entries", tags=["entries"], route_class=JSONRoute
)


@router.get("", operation_id="listEntries", responses=error_responses(401, 404, 422))
async def list_entries(
    session_id: UUID,
    engine: Engine,
    tenant: Tenant,
    settings: Config,
    after_seq: Annotated[int | None, Query(ge=0, le=MAX_ENTRY_SEQ)] = None,
    before_seq: Annotated[int | None, Query(ge=1, le=MAX_ENTRY_SEQ)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    kinds: Annotated[list[EntryKind] | None, Query(description="Only these kinds.")] = None,
    order: Literal["asc", "desc"] = "asc",
) -> EntryPage:
    if limit > settings.max_page_size:
        raise Invalid(
            "limit_too_large",
            f"limit may be at most {settings.max_page_size}",
            {"loc": ["query", "limit"], "max": settings.max_page_size},
        )
    page = await service.read_history(
        engine,
        tenant,
        str(session_id),
        after_seq=after_seq,
        before_seq=before_seq,
        limit=limit,
        kinds=[str(k) for k in kinds] if kinds else None,
        order=order,
    )
    return EntryPage(
        data=[Entry.from_row(r) for r in page.entries], has_more=page.has_more, rev=page.rev
    )


@router.post(
    "",
    operation_id="appendEntries",
    status_code=201,
    responses={
        200: {"model": AppendResponse, "description": "Replay: every id was already there."},
        **error_responses(400, 401, 404, 409, 413, 422),
    },
)
async def append_entries(
    session_id: UUID,
    body: AppendRequest,
    response: Response,
    engine: Engine,
    tenant: Tenant,
    settings: Config,
) -> AppendResponse:
    if len(body.entries) > settings.max_append_entries:
        raise Invalid(
            "too_many_entries",
            f"at most {settings.max_append_entries} entries per append",
            {"loc": ["body", "entries"], "max": settings.max_append_entries},
        )
    entries = [
        NewEntry(
            kind=EntryKind(e.kind),
            payload=e.payload.model_dump(mode="json", exclude_none=True),
            refs=e.refs_json(),
            id=e.id,
        )
        for e in body.entries
    ]
    await content_checks.check_appended(engine, settings, tenant, str(session_id), entries)
    result = await service.append_entries(
        engine, tenant, str(session_id), entries, expected_rev=body.expected_rev
    )
    if result.replayed:
        response.status_code = 200
    return AppendResponse(
        entries=[Entry.from_row(r) for r in result.entries],
        rev=result.rev,
        replayed=result.replayed,
    )
