"""Routes for session files: export a session as JSON Lines, import one as a new session."""

from __future__ import annotations

from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse
from pydantic import ValidationError

from app.api.bodies import JSONRoute
from app.api.deps import Config, Engine, ReadingTenant, Tenant
from app.api.errors import Refusal, error_responses
from app.api.schemas import Session, SessionCreate
from app.core.session_file import FORMAT, VERSION, SessionFields
from app.services import session_files as service
from app.services.errors import Invalid
from app.services.sessions import get_session

router = APIRouter(prefix="/v1/sessions", tags=["sessions"], route_class=JSONRoute)

IMPORT_PATH = "/v1/sessions/import"
# A session file travels as bytes (a generated client reads and sends it as a file) or under
# any of JSON Lines' usual names.
MEDIA_TYPE = "application/octet-stream"
UPLOAD_TYPES = frozenset(
    {MEDIA_TYPE, "application/x-ndjson", "application/jsonl", "application/x-jsonlines"}
)
_BYTES = {"schema": {"type": "string", "format": "binary"}}
_FILE_DOC = (
    f"A session file: JSON Lines, format `{FORMAT}` version {VERSION} (the README's "
    "“Session files” section): a header line, every entry of the thread, the memory it uses "
    "if asked for, an end line counting the entries."
)


@router.get(
    "/{session_id}/export",
    operation_id="exportSession",
    responses={
        200: {"content": {MEDIA_TYPE: _BYTES}, "description": _FILE_DOC},
        **error_responses(401, 404, 422),
    },
    response_class=StreamingResponse,
)
async def export_session(
    session_id: UUID,
    engine: Engine,
    tenant: ReadingTenant,
    memory: Annotated[
        bool, Query(description="Include the memory namespace the session uses.")
    ] = False,
) -> StreamingResponse:
    await get_session(engine, tenant, str(session_id))  # 404 before the stream starts
    lines = service.export_lines(engine, tenant, str(session_id), memory=memory)
    return StreamingResponse(
        lines,
        media_type=MEDIA_TYPE,
        headers={"Content-Disposition": f'attachment; filename="session-{session_id}.jsonl"'},
    )


@router.post(
    "/import",
    operation_id="importSession",
    status_code=201,
    responses=error_responses(400, 401, 409, 413, 415, 422),
    openapi_extra={
        "requestBody": {
            "required": True,
            "description": _FILE_DOC,
            "content": {MEDIA_TYPE: _BYTES},
        }
    },
)
async def import_session(
    request: Request, engine: Engine, tenant: Tenant, settings: Config
) -> Session:
    """A new session holding the file's thread: all of it, or nothing (any problem is a 4xx
    naming the file's line). Entry ids and seqs are kept. Sent as application/octet-stream,
    application/x-ndjson, application/jsonl or application/x-jsonlines."""
    # No Content-Type: bytes, as curl's --data-binary @file -H '...' forgot to say.
    media_type = request.headers.get("content-type", MEDIA_TYPE).split(";")[0].strip().lower()
    if media_type not in UPLOAD_TYPES:
        raise Refusal(
            415,
            "unsupported_media_type",
            f"send the session file as {' or '.join(sorted(UPLOAD_TYPES))}",
        )
    session = await service.import_session(
        engine, tenant, request.stream(), settings=settings, check_fields=session_fields
    )
    return Session.of(session)


def session_fields(fields: SessionFields) -> SessionFields:
    """The file's title, metadata and config, checked as a create request's are."""
    try:
        checked = SessionCreate.model_validate(
            {"title": fields.title, "metadata": fields.metadata, "config": fields.config}
        )
    except ValidationError as exc:
        errors = [
            {"loc": ["session", *e["loc"]], "msg": e["msg"], "type": e["type"]}
            for e in exc.errors()
        ]
        where = ".".join(str(p) for p in errors[0]["loc"])
        raise Invalid(
            "invalid_header",
            f"line 1: {where}: {errors[0]['msg']}",
            {"line": 1, "errors": errors},
        ) from None
    return fields.model_copy(
        update={
            "title": checked.title,
            "metadata": checked.metadata,
            "config": checked.config.model_dump(mode="json", exclude_none=True),
        }
    )
