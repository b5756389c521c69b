"""Routes that inspect the context: the exact projection an ask would send, and its usage."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from fastapi import APIRouter

from app.api.bodies import JSONRoute
from app.api.deps import Config, Engine, ReadingTenant, Tenant
from app.api.errors import error_responses
from app.api.schemas import Compaction, ContextUsage, ProjectionRequest, ProjectionResponse
from app.core.entries import PendingEntry
from app.core.formats import to_anthropic, to_neutral, to_openai, to_openai_responses
from app.services.projection import project_session, session_context

router = APIRouter(prefix="/v1/sessions/{session_id}", tags=["context"], route_class=JSONRoute)

# Anthropic's carries the cache_control marks at the projection's cache_breakpoints.
_FORMATS = {"neutral": to_neutral, "openai": to_openai, "openai_responses": to_openai_responses}


@router.post(
    "/projection",
    operation_id="projectSession",
    responses=error_responses(400, 401, 404, 413, 422),
)
async def projection(
    session_id: UUID,
    body: ProjectionRequest,
    engine: Engine,
    tenant: ReadingTenant,
    settings: Config,
) -> ProjectionResponse:
    """Exactly the messages and meta an ask would send now. Writes nothing."""
    pending = [
        PendingEntry(e.kind, e.payload.model_dump(mode="json", exclude_none=True), e.refs_json())
        for e in body.pending
    ]
    policy: dict[str, Any] | None = (
        body.policy.model_dump(exclude_none=True) if body.policy is not None else None
    )
    result = await project_session(
        engine,
        settings,
        tenant,
        str(session_id),
        pending=pending,
        policy=policy,
        model=body.model,
        extra_tools=[t.model_dump(mode="json", exclude_none=True) for t in body.tools or []],
    )
    projected = result.projection
    return ProjectionResponse(
        model=result.model,
        format=body.format,
        context_window=result.context_window,
        policy=result.policy.model_dump(mode="json"),
        meta=projected.meta,
        request=(
            to_anthropic(projected.messages, projected.tool_spec, projected.meta.cache_breakpoints)
            if body.format == "anthropic"
            else _FORMATS[body.format](projected.messages, projected.tool_spec)
        ),
    )


@router.get("/context", operation_id="getContext", responses=error_responses(401, 404, 422))
async def context(
    session_id: UUID, engine: Engine, tenant: Tenant, settings: Config
) -> ContextUsage:
    """How full the context is, like a /context command."""
    usage = await session_context(engine, settings, tenant, str(session_id))
    result = usage.projected
    meta, policy = result.projection.meta, result.policy
    breakdown = {
        "system": meta.system_tokens,
        "memory": meta.memory_tokens,
        "summary": meta.summary_tokens,
        "tools": meta.tools_tokens,
        "history": meta.history_tokens,
    }
    breakdown["overhead"] = meta.estimated_tokens - sum(breakdown.values())
    return ContextUsage(
        model=result.model,
        context_window=result.context_window,
        budget=policy.budget,
        reserve_output_tokens=policy.reserve,
        tokens=meta.estimated_tokens,
        percent_of_window=round(100 * meta.estimated_tokens / result.context_window, 2),
        threshold=policy.compress_threshold,
        threshold_tokens=int(policy.compress_threshold * policy.budget),
        messages=len(result.projection.messages),
        entries_included=meta.entries_included,
        entries_total=meta.entries_total,
        summaries=usage.summaries,
        summary_used=meta.summary_used,
        truncated=meta.truncated,
        needs_summary=meta.needs_summary,
        breakdown=breakdown,
        shares={k: round(100 * v / result.context_window, 2) for k, v in breakdown.items()},
        compactions=[
            Compaction(
                seq=row["seq"],
                from_seq=row["payload"]["from_seq"],
                to_seq=row["payload"]["to_seq"],
                model=row["payload"].get("model"),
                focus=row["payload"].get("focus"),
                tokens=row["token_count"],
                created_at=row["created_at"],
            )
            for row in usage.recent_summaries
        ],
        compactable=usage.nothing_to_compact is None,
        not_compactable_reason=usage.nothing_to_compact,
    )
