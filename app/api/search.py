"""Route for searching a session's history."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Query
from pydantic import BaseModel

from app.api.bodies import JSONRoute
from app.api.deps import Engine, Tenant
from app.api.errors import error_responses
from app.core.entries import EntryKind
from app.services.search import search_history

router = APIRouter(prefix="/v1/sessions/{session_id}", tags=["entries"], route_class=JSONRoute)


class SearchHit(BaseModel):
    seq: int
    id: str
    kind: str
    excerpt: str
    rank: float
    created_at: datetime


class SearchResults(BaseModel):
    data: list[SearchHit]


@router.get("/search", operation_id="searchHistory", responses=error_responses(401, 404, 422))
async def search(
    session_id: UUID,
    engine: Engine,
    tenant: Tenant,
    q: Annotated[str, Query(min_length=1, max_length=1000, description='Words, "a phrase", -not.')],
    limit: Annotated[int, Query(ge=1, le=100)] = 10,
    kinds: Annotated[list[EntryKind] | None, Query(description="Only these kinds.")] = None,
) -> SearchResults:
    """Full-text search of the whole history (forks include their parent's prefix)."""
    rows = await search_history(
        engine, tenant, str(session_id), q, limit=limit, kinds=[str(k) for k in kinds or []]
    )
    return SearchResults(
        data=[
            SearchHit(
                seq=r["seq"],
                id=r["id"],
                kind=r["kind"],
                excerpt=r["excerpt"],
                rank=float(r["rank"]),
                created_at=r["created_at"],
            )
            for r in rows
        ]
    )
