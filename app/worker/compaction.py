"""Compaction in the worker: a compaction job's run, and a run compacting its own full context.

Clients see `context.compacting` when the summarizer is called (a compaction run then reports
`context.compaction_progress` while it writes), then `context.compacted` (the checkpoint is
committed) or `context.compaction_failed` (nothing committed: the model failed or its summary was
refused; the session goes on with windowing, so a failed summary never loses anything). An ask
never waits longer than its policy's `compaction_wait_seconds` for a compaction: past it, it sees
`context.compaction_pending` and is answered from windowing while the summary is still written,
for later asks.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import RowMapping

from app.core.compaction import nothing_to_compact
from app.core.runs import Outcome, Run, RunKind, RunStatus, entry_id
from app.core.sessions import SessionConfig
from app.db import runs as runs_db
from app.db.engine import autocommit
from app.eventlog.registry import EventType
from app.llm.base import ProviderError
from app.llm.catalog import context_window
from app.services import compaction
from app.services.errors import ServiceError
from app.services.projection import SessionProjection, project_for_run, resolve_policy
from app.worker.runtime import PendingCompaction, Runtime

log = logging.getLogger(__name__)
SUMMARY_PART = "summary"  # a compaction job's summary entry id: run:<run_id>:summary
# How often a waiting run looks at the runs it waits for (a compaction job behind earlier asks,
# an ask behind an earlier compaction job).
POLL_SECONDS = 0.1


@dataclass(frozen=True)
class AutoCompaction:
    summary: compaction.Summary | None  # committed: the run projects again
    failed: bool = False  # the summarizer failed: windowing, and no second try in this run


async def compaction_job(runtime: Runtime, run: Run) -> Outcome:
    """The run of POST /compact: summarize up to the kept turns and commit the checkpoint."""
    params = run.params
    run_id, tenant_id, session_id = run.id, run.tenant_id, run.session_id
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
            keep_last_turns=params.keep_last_turns,
            model=run.model,
            focus=params.focus,
        )
    except ServiceError as exc:
        return Outcome("failed", error={"code": exc.code, "message": exc.message})
    if prepared is None:  # the ask it waited for added nothing compactable
        message = nothing_to_compact(params.keep_last_turns)
        error = {"code": "nothing_to_compact", "message": message}
        return Outcome("failed", error=error)
    before = await _tokens(runtime, run)
    try:
        summary = await _compact(runtime, run, prepared, "requested", before, SUMMARY_PART)
    except (ProviderError, compaction.CompactionFailed) as exc:
        log.warning("run %s: compaction failed, nothing committed: %s", run_id, exc)
        runtime.writer.emit(run_id, EventType.CONTEXT_COMPACTION_FAILED, _failed(exc), urgent=True)
        return Outcome("failed", error=_error(exc), model=prepared.model)
    return Outcome("completed", summary.content, summary.usage, model=summary.model)


async def auto_compact(runtime: Runtime, run: Run, projected: SessionProjection) -> AutoCompaction:
    """Compact before a model call whose context is full (policy summarization: auto). When
    nothing is committed, the run goes on with the projection it has (windowing).

    The summary is written in a task of its own, which the run waits for at most the policy's
    compaction_wait_seconds: past that, the run windows and the task goes on to commit the
    summary for later asks (the session's next ask here joins it rather than start another)."""
    meta = projected.projection.meta
    run_id, session_id = run.id, run.session_id
    pending = runtime.compactions.get(session_id)
    if pending is None:
        try:
            prepared = await compaction.prepare(
                runtime.engine,
                runtime.settings,
                run.tenant_id,
                session_id,
                # the run's own turn is always kept: it is what the model is about to answer
                keep_last_turns=max(1, projected.policy.keep_last_turns),
                run_id=run_id,
                answer_model=run.model,
                policy_overrides=run.params.context_policy,
            )
        except ServiceError as exc:
            runtime.writer.emit(run_id, EventType.CONTEXT_COMPACTION_FAILED, _failed(exc))
            return AutoCompaction(None, failed=True)
        if prepared is None:
            return AutoCompaction(None)  # only the kept turns are left: windowing must do
        part = f"compaction:{prepared.plan.to_seq}"
        pending = _start(runtime, session_id, prepared, entry_id(run_id, part), {"run_id": run_id})
    _compacting(runtime, run_id, pending.prepared, "auto", meta.estimated_tokens)
    wait = projected.policy.compaction_wait_seconds
    try:
        summary, entry = await asyncio.wait_for(asyncio.shield(pending.task), wait)
    except TimeoutError:
        log.info("run %s: compaction still running after %s s, windowing", run_id, wait)
        runtime.writer.emit(run_id, EventType.CONTEXT_COMPACTION_PENDING, _pending(pending, wait))
        return AutoCompaction(None, failed=True)
    except (ProviderError, ServiceError) as exc:
        log.warning("run %s: compaction failed, falling back to windowing: %s", run_id, exc)
        runtime.writer.emit(run_id, EventType.CONTEXT_COMPACTION_FAILED, _failed(exc))
        return AutoCompaction(None, failed=True)
    await _compacted(runtime, run, pending.prepared, summary, entry, "auto", meta.estimated_tokens)
    return AutoCompaction(summary)


def _start(
    runtime: Runtime,
    session_id: str,
    prepared: compaction.PreparedCompaction,
    summary_id: str,
    refs: dict[str, Any],
) -> PendingCompaction:
    async def write() -> tuple[compaction.Summary, RowMapping]:
        try:
            summary = await compaction.summarize(runtime.router, prepared)
            entry = await compaction.commit(runtime.engine, prepared, summary, summary_id, refs)
        except (ProviderError, ServiceError) as exc:
            log.warning("session %s: compaction failed: %s", session_id, exc)
            raise
        finally:
            # Out of the registry as soon as it is settled, by whichever run awaits it or none.
            current = runtime.compactions.get(session_id)
            if current is not None and current.task is asyncio.current_task():
                del runtime.compactions[session_id]
        log.info("session %s: summary committed at seq %s", session_id, entry["seq"])
        return summary, entry

    task = asyncio.create_task(write(), name=f"compaction:{session_id}")
    # Its outcome is logged above; nobody may be left to await it.
    task.add_done_callback(lambda t: t.cancelled() or t.exception())
    pending = PendingCompaction(prepared, task)
    runtime.compactions[session_id] = pending
    return pending


def _pending(pending: PendingCompaction, waited: float) -> dict[str, Any]:
    plan = pending.prepared.plan
    return {
        "from_seq": plan.from_seq,
        "to_seq": plan.to_seq,
        "waited_seconds": waited,
        "fallback": "windowing",
    }


async def await_compaction_jobs(
    runtime: Runtime, run: Run, config: SessionConfig, active: Sequence[Run] | None = None
) -> bool:
    """Before an ask's first model call: wait for the compaction jobs queued before it (they
    run beside asks, on a lock of their own) at most the policy's compaction_wait_seconds.
    True when one is still running: the ask then windows (and starts no compaction of its own),
    and emits `context.compaction_pending`. `active`: the session's unfinished compactions,
    when the caller has just read them (else read here first)."""
    if active is not None and not [r for r in active if r.created_at < run.created_at]:
        return False  # none queued before it: nothing to wait for, no policy to resolve
    try:
        policy = resolve_policy(
            context_window(run.model),
            runtime.settings.context_policy,
            config.context_policy,
            run.params.context_policy,
        )
    except ServiceError:
        return False  # the ask's own projection reports it
    loop = asyncio.get_running_loop()
    deadline = loop.time() + policy.compaction_wait_seconds
    while True:
        if active is None:
            async with autocommit(runtime.engine) as conn:
                active = await runs_db.active_runs(
                    conn, run.session_id, kind="compaction", tenant_id=run.tenant_id
                )
        earlier = [r for r in active if r.created_at < run.created_at]
        active = None  # looked at: the next look reads them again
        if not earlier:
            return False
        if loop.time() >= deadline:
            break
        await asyncio.sleep(POLL_SECONDS)
    runtime.writer.emit(
        run.id,
        EventType.CONTEXT_COMPACTION_PENDING,
        {
            "run_id": earlier[0].id,
            "waited_seconds": policy.compaction_wait_seconds,
            "fallback": "windowing",
        },
    )
    return True


async def await_earlier_asks(runtime: Runtime, run_id: str) -> None:
    """A compaction job starts once the asks running before it have ended their turn (which it
    then summarizes with the rest): what the session's job lock did when the two shared it.
    Asks not running (queued behind another, or waiting for tool outputs) are not waited for:
    their turns stay raw, and a queued one may need this worker slot to run at all. Asks no
    longer wait in the queue behind a compaction: see await_compaction_jobs."""
    async with autocommit(runtime.engine) as conn:
        run = await runs_db.get_run(conn, run_id)
    if run is None or run.kind is not RunKind.COMPACTION:
        return
    while True:
        async with autocommit(runtime.engine) as conn:
            active = await runs_db.active_runs(
                conn, run.session_id, kind="ask", tenant_id=run.tenant_id
            )
        if not any(r.created_at < run.created_at and r.status is RunStatus.RUNNING for r in active):
            return
        await asyncio.sleep(POLL_SECONDS)


async def _compact(
    runtime: Runtime,
    run: Run,
    prepared: compaction.PreparedCompaction,
    reason: str,
    tokens_before: int | None,
    part: str,
) -> compaction.Summary:
    run_id = run.id
    _compacting(runtime, run_id, prepared, reason, tokens_before)

    def progress(at: compaction.Progress) -> None:
        data = {"call": at.call, "calls": at.calls, "chars": at.chars}
        runtime.writer.emit(run_id, EventType.CONTEXT_COMPACTION_PROGRESS, data, urgent=True)

    summary = await compaction.summarize(runtime.router, prepared, progress)
    entry = await compaction.commit(
        runtime.engine, prepared, summary, entry_id(run_id, part), {"run_id": run_id}
    )
    await _compacted(runtime, run, prepared, summary, entry, reason, tokens_before)
    return summary


def _compacting(
    runtime: Runtime,
    run_id: str,
    prepared: compaction.PreparedCompaction,
    reason: str,
    tokens_before: int | None,
) -> None:
    plan = prepared.plan
    runtime.writer.emit(
        run_id,
        EventType.CONTEXT_COMPACTING,
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


async def _compacted(
    runtime: Runtime,
    run: Run,
    prepared: compaction.PreparedCompaction,
    summary: compaction.Summary,
    entry: RowMapping,
    reason: str,
    tokens_before: int | None,
) -> None:
    run_id, plan = run.id, prepared.plan
    seq = int(entry["seq"])
    runtime.writer.emit(
        run_id, EventType.ENTRY_COMMITTED, {"seq": seq, "kind": entry["kind"], "id": entry["id"]}
    )
    runtime.writer.emit(
        run_id,
        EventType.CONTEXT_COMPACTED,
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
            "cut": summary.cut,
        },
        urgent=True,
    )


async def _tokens(runtime: Runtime, run: Run) -> int | None:
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
