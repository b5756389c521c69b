"""Executing one run: project, stream the model, forward deltas, commit the answer.

The run resumes from the journal, never from memory: a run retried after its worker died starts
over from its committed user entry (clients get `message.reset`), and its closing entries have
ids derived from the run, so nothing is ever written twice.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy import RowMapping

from app.db import events as events_db
from app.db import runs as runs_db
from app.db.tables import RUN_TERMINAL
from app.llm.base import ModelRequest, ProviderError, TextDelta, UsageReport
from app.services.errors import ServiceError
from app.services.projection import project_session
from app.services.runs import Outcome, finish_run
from app.worker.runtime import Runtime

log = logging.getLogger(__name__)
WARNING_SHARE, LIMIT_SHARE = 0.8, 1.0


@dataclass
class _Progress:
    """What a run has received so far: committed as incomplete if it is stopped."""

    text: list[str] = field(default_factory=list)
    usage: UsageReport | None = None
    model: str | None = None


async def execute_run(
    runtime: Runtime, run_id: str, abort_reason: Callable[[], str | None]
) -> None:
    """Execute a run. procrastinate stops a job by cancelling its task: a user's cancel ends
    the run `cancelled` with what arrived; a worker shutdown re-raises, so the job is retried
    and the run resumes elsewhere."""
    run = await _claim(runtime, run_id)
    if run is None:
        return
    writer = runtime.writer
    progress = _Progress(model=run["model"])
    try:
        if run["attempts"] > 1:  # a retry: what clients saw of the last attempt is void
            writer.emit(run_id, "message.reset", {"reason": "retry", "attempt": run["attempts"]})
        writer.emit(run_id, "run.started", {"attempt": run["attempts"]}, urgent=True)
        try:
            outcome = await _converse(runtime, run, progress)
        except asyncio.CancelledError:
            if abort_reason() != "user_request":
                raise
            text = "".join(progress.text)
            outcome = Outcome("cancelled", text, progress.usage, model=progress.model)
        except Exception as exc:  # a bug must still end the run, clearly
            log.exception("run %s crashed", run_id)
            outcome = Outcome("failed", error={"code": "internal_error", "message": str(exc)})
        await _finish(runtime, run_id, outcome)
    finally:
        writer.close(run_id)


async def _finish(runtime: Runtime, run_id: str, outcome: Outcome) -> None:
    await runtime.writer.flush()
    async with runtime.engine.begin() as conn:
        locked = await runs_db.get_run(conn, run_id, lock=True)
        if locked is None or locked["status"] in RUN_TERMINAL:
            return
        if locked["cancel_mode"] and outcome.status == "completed":
            # the answer finished before the cancel landed: still, it was cancelled
            outcome = Outcome("cancelled", outcome.text, outcome.usage, model=outcome.model)
        await finish_run(conn, locked, outcome, runtime.writer.next_seq(run_id))


async def _claim(runtime: Runtime, run_id: str) -> RowMapping | None:
    """Start an attempt, or end a run that was cancelled before it started; None: nothing to do."""
    async with runtime.engine.begin() as conn:
        run = await runs_db.get_run(conn, run_id, lock=True)
        if run is None or run["status"] in RUN_TERMINAL:
            return None
        next_seq = await events_db.last_seq(conn, run_id) + 1
        if run["cancel_mode"]:
            await finish_run(conn, run, Outcome("cancelled"), next_seq)
            return None
        started = await runs_db.start_attempt(conn, run_id)
    runtime.writer.open(run_id, next_seq)
    return started


async def _converse(runtime: Runtime, run: RowMapping, progress: _Progress) -> Outcome:
    run_id, params = str(run["id"]), run["params"]
    try:
        projected = await project_session(
            runtime.engine,
            runtime.settings,
            str(run["tenant_id"]),
            str(run["session_id"]),
            policy=params.get("context_policy"),
            model=run["model"],
            run_id=run_id,
        )
    except ServiceError as exc:  # e.g. the context overflowed while the run was queued
        return Outcome("failed", error={"code": exc.code, "message": exc.message})
    projection = projected.projection
    _warn_if_full(runtime, run_id, projection.meta.estimated_tokens, projection.meta.budget)
    request = ModelRequest(
        model=run["model"].partition(":")[2],
        messages=projection.messages,
        tools=projection.tool_spec,
        max_output_tokens=params.get("max_output_tokens"),
        temperature=params.get("temperature"),
    )
    stream = runtime.router.stream(run["model"], request, fallback=params.get("fallback_model"))
    try:
        async for model, event in stream:
            progress.model = model
            if isinstance(event, TextDelta) and event.text:
                progress.text.append(event.text)
                runtime.writer.emit(run_id, "message.delta", {"text": event.text})
            elif isinstance(event, UsageReport):
                progress.usage = event
    except ProviderError as exc:
        error = {"code": f"provider_{exc.kind}", "message": exc.message}
        return Outcome(
            "failed", "".join(progress.text), progress.usage, error=error, model=progress.model
        )
    return Outcome("completed", "".join(progress.text), progress.usage, model=progress.model)


def _warn_if_full(runtime: Runtime, run_id: str, tokens: int, budget: int) -> None:
    share = tokens / budget if budget else 0.0
    if share >= WARNING_SHARE:
        level = "at_limit" if share >= LIMIT_SHARE else "approaching_limit"
        runtime.writer.emit(
            run_id,
            "context.warning",
            {"level": level, "tokens": tokens, "budget": budget, "percent": round(100 * share, 1)},
        )
