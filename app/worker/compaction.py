"""Compaction in the worker: a compaction job's run, and a run compacting its own full context.

Clients see `context.compacting` when the summarizer is called, then `context.compacted`
(the checkpoint is committed) or `context.compaction_failed` (nothing committed; an ask then
goes on with windowing, so a failed summary never loses it).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from sqlalchemy import RowMapping

from app.llm.base import ProviderError
from app.services import compaction
from app.services.errors import ServiceError
from app.services.projection import SessionProjection, project_for_run
from app.services.runs import Outcome, entry_id
from app.worker.runtime import Runtime

log = logging.getLogger(__name__)
SUMMARY_PART = "summary"  # a compaction job's summary entry id: run:<run_id>:summary


@dataclass(frozen=True)
class AutoCompaction:
    summary: compaction.Summary | None  # committed: the run projects again
    failed: bool = False  # the summarizer failed: windowing, and no second try in this run


async def compaction_job(runtime: Runtime, run: RowMapping) -> Outcome:
    """The run of POST /compact: summarize up to the kept turns and commit the checkpoint."""
    params = run["params"]
    run_id, tenant_id, session_id = str(run["id"]), str(run["tenant_id"]), str(run["session_id"])
    summary_id = entry_id(run_id, SUMMARY_PART)
    done = await compaction.committed_summary(runtime.engine, tenant_id, session_id, summary_id)
    if done is not None:  # an attempt whose worker died after committing it: finish the run
        return Outcome("completed", done["payload"]["content"], model=done["payload"]["model"])
    try:
        prepared = await compaction.prepare(
            runtime.engine,
            runtime.settings,
            tenant_id,
            session_id,
            keep_last_turns=params.get("keep_last_turns"),
            model=run["model"],
            focus=params.get("focus"),
        )
    except ServiceError as exc:
        return Outcome("failed", error={"code": exc.code, "message": exc.message})
    if prepared is None:  # the ask it waited for added nothing compactable
        error = {
            "code": "nothing_to_compact",
            "message": "nothing precedes the turns a compaction keeps",
        }
        return Outcome("failed", error=error)
    before = await _tokens(runtime, run)
    try:
        summary = await _compact(runtime, run, prepared, "requested", before, SUMMARY_PART)
    except (ProviderError, compaction.CompactionFailed) as exc:
        return Outcome("failed", error=_error(exc), model=prepared.model)
    return Outcome("completed", summary.content, summary.usage, model=summary.model)


async def auto_compact(
    runtime: Runtime, run: RowMapping, projected: SessionProjection
) -> AutoCompaction:
    """Compact before a model call whose context is full (policy summarization: auto). When
    nothing is committed, the run goes on with the projection it has (windowing)."""
    params = run["params"]
    meta = projected.projection.meta
    run_id = str(run["id"])
    try:
        prepared = await compaction.prepare(
            runtime.engine,
            runtime.settings,
            str(run["tenant_id"]),
            str(run["session_id"]),
            # the run's own turn is always kept: it is what the model is about to answer
            keep_last_turns=max(1, projected.policy.keep_last_turns),
            run_id=run_id,
            answer_model=run["model"],
            policy_overrides=params.get("context_policy"),
        )
    except ServiceError as exc:
        runtime.writer.emit(run_id, "context.compaction_failed", _failed(exc))
        return AutoCompaction(None, failed=True)
    if prepared is None:
        return AutoCompaction(None)  # only the kept turns are left: windowing must do
    try:
        summary = await _compact(
            runtime,
            run,
            prepared,
            "auto",
            meta.estimated_tokens,
            f"compaction:{prepared.plan.to_seq}",
        )
    except (ProviderError, compaction.CompactionFailed) as exc:
        log.warning("run %s: compaction failed, falling back to windowing: %s", run_id, exc)
        runtime.writer.emit(run_id, "context.compaction_failed", _failed(exc))
        return AutoCompaction(None, failed=True)
    return AutoCompaction(summary)


async def _compact(
    runtime: Runtime,
    run: RowMapping,
    prepared: compaction.PreparedCompaction,
    reason: str,
    tokens_before: int | None,
    part: str,
) -> compaction.Summary:
    run_id, plan = str(run["id"]), prepared.plan
    runtime.writer.emit(
        run_id,
        "context.compacting",
        {
            "reason": reason,
            "from_seq": plan.from_seq,
            "to_seq": plan.to_seq,
            "entries": len(plan.entries),
            "kept_turns": plan.kept_turns,
            "tokens": tokens_before,
            "model": prepared.model,
            "focus": prepared.focus,
        },
        urgent=True,
    )
    summary = await compaction.summarize(runtime.router, prepared)
    entry = await compaction.commit(
        runtime.engine, prepared, summary, entry_id(run_id, part), {"run_id": run_id}
    )
    seq = int(entry["seq"])
    runtime.writer.emit(
        run_id, "entry.committed", {"seq": seq, "kind": entry["kind"], "id": entry["id"]}
    )
    runtime.writer.emit(
        run_id,
        "context.compacted",
        {
            "reason": reason,
            "summary_seq": seq,
            "from_seq": plan.from_seq,
            "to_seq": plan.to_seq,
            "tokens_before": tokens_before,
            "tokens_after": await _tokens(runtime, run),
            "summary_tokens": int(entry["token_count"]),
            "model": summary.model,
            "calls": summary.calls,
        },
        urgent=True,
    )
    return summary


async def _tokens(runtime: Runtime, run: RowMapping) -> int | None:
    """The context an ask would send now (None if it cannot be projected)."""
    try:
        projected = await project_for_run(runtime.engine, runtime.settings, run)
    except ServiceError:
        return None
    return projected.projection.meta.estimated_tokens


def _error(exc: ProviderError | ServiceError) -> dict[str, str]:
    if isinstance(exc, ProviderError):
        return exc.as_error()
    return {"code": exc.code, "message": exc.message}


def _failed(exc: ProviderError | ServiceError) -> dict[str, Any]:
    return {"error": _error(exc), "fallback": "windowing"}
