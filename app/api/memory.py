"""Routes for persistent memory: list, read, create/replace, find/replace, delete, by ETag."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Path, Query, Response

from app.api.bodies import JSONRoute
from app.api.deps import Config, Engine, Tenant
from app.api.errors import error_responses
from app.api.schemas import Memory, MemoryList, MemoryPatch, MemoryPut, MemorySummary
from app.core.memory import NAMESPACE_PATTERN
from app.services import memory as service
from app.services.errors import Invalid

router = APIRouter(prefix="/v1/memory", tags=["memory"], route_class=JSONRoute)

Namespace = Annotated[
    str,
    Path(
        pattern=NAMESPACE_PATTERN,
        description="Letters, digits and _ . : - (not starting with a dot), 1 to 128.",
    ),
]
IfMatch = Annotated[
    str | None,
    Header(
        max_length=1024,
        description='Write only if the current ETag is this one (e.g. "v3-h7w22nm1xc"), else '
        "412; `*`: only if the memory exists.",
    ),
]

# Documented on every response that sends it (the memory's `etag` field, as a header).
ETAG_HEADER = {
    "ETag": {
        "description": "The memory's version: send it as If-Match to write.",
        "schema": {"type": "string"},
    }
}


def _memory(memory: service.Memory, response: Response) -> Memory:
    response.headers["ETag"] = memory.etag
    return Memory(
        namespace=memory.namespace,
        content=memory.content,
        version=memory.version,
        etag=memory.etag,
        bytes=memory.bytes,
        lines=memory.lines,
        created_at=memory.created_at,
        updated_at=memory.updated_at,
    )


@router.get("", operation_id="listMemory", responses=error_responses(401, 422))
async def list_memory(
    engine: Engine,
    tenant: Tenant,
    settings: Config,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Annotated[str | None, Query(max_length=128)] = None,
    prefix: Annotated[
        str | None, Query(max_length=128, description="Only namespaces starting with this.")
    ] = None,
) -> MemoryList:
    """The tenant's memory namespaces in byte order, without their contents."""
    if limit > settings.max_page_size:
        raise Invalid(
            "limit_too_large",
            f"limit may be at most {settings.max_page_size}",
            {"loc": ["query", "limit"], "max": settings.max_page_size},
        )
    page = await service.list_memories(engine, tenant, limit=limit, cursor=cursor, prefix=prefix)
    return MemoryList(
        data=[
            MemorySummary(
                namespace=r["namespace"],
                version=r["version"],
                etag=service.etag(r),
                bytes=r["bytes"],
                lines=r["lines"],
                created_at=r["created_at"],
                updated_at=r["updated_at"],
            )
            for r in page.items
        ],
        has_more=page.next_cursor is not None,
        next_cursor=page.next_cursor,
    )


@router.get(
    "/{namespace}",
    operation_id="getMemory",
    responses={200: {"headers": ETAG_HEADER}, **error_responses(401, 404, 422)},
)
async def get_memory(
    namespace: Namespace, engine: Engine, tenant: Tenant, response: Response
) -> Memory:
    """The memory and its ETag."""
    return _memory(await service.get_memory(engine, tenant, namespace), response)


@router.put(
    "/{namespace}",
    operation_id="putMemory",
    responses={
        200: {"headers": ETAG_HEADER},
        201: {"model": Memory, "description": "Created.", "headers": ETAG_HEADER},
        **error_responses(400, 401, 412, 413, 422),
    },
)
async def put_memory(
    namespace: Namespace,
    body: MemoryPut,
    engine: Engine,
    tenant: Tenant,
    response: Response,
    if_match: IfMatch = None,
    if_none_match: Annotated[
        str | None,
        Header(max_length=1024, description="`*`: create only (412 if the memory exists)."),
    ] = None,
) -> Memory:
    """Create (201) or replace (200) the whole memory."""
    written = await service.put_memory(
        engine, tenant, namespace, body.content, if_match=if_match, if_none_match=if_none_match
    )
    if written.created:
        response.status_code = 201
    return _memory(written.memory, response)


@router.patch(
    "/{namespace}",
    operation_id="patchMemory",
    responses={200: {"headers": ETAG_HEADER}, **error_responses(400, 401, 404, 412, 413, 422)},
)
async def patch_memory(
    namespace: Namespace,
    body: MemoryPatch,
    engine: Engine,
    tenant: Tenant,
    response: Response,
    if_match: IfMatch = None,
) -> Memory:
    """Find and replace (like the update_memory tool): old_string must occur exactly once,
    or set replace_all."""
    written = await service.update_memory(
        engine,
        tenant,
        namespace,
        body.old_string,
        body.new_string,
        replace_all=body.replace_all,
        if_match=if_match,
    )
    return _memory(written.memory, response)


@router.delete(
    "/{namespace}",
    operation_id="deleteMemory",
    status_code=204,
    responses=error_responses(401, 404, 412, 422),
)
async def delete_memory(
    namespace: Namespace, engine: Engine, tenant: Tenant, if_match: IfMatch = None
) -> Response:
    await service.delete_memory(engine, tenant, namespace, if_match=if_match)
    return Response(status_code=204)
