"""Executing one run: project, stream the model, forward deltas, commit the answer.

The run resumes from the journal, never from memory: a run retried after its worker died starts
over from its committed user entry (clients get `message.reset`), and its closing entries have
ids derived from the run, so nothing is ever written twice. A model call that fails after its
output began is asked again in the same way, within the router's retries (`_void_attempt`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core import approvals as approval_texts
from app.core import tool_choice as tool_choices
from app.core.approvals import ApprovalRule
from app.core.content import TOOL_CALLS_BEFORE
from app.core.entries import EntryKind, FinishReason, JournalEntry, NewEntry
from app.core.mcp import McpServer
from app.core.messages import result_text, text_of
from app.core.output_schema import ResponseFormat, answer_problem
from app.core.projection import ProjectionMeta
from app.core.reasoning import Reasoning
from app.core.run_policy import RunPolicy
from app.core.runs import Outcome, Run, RunKind, entry_id
from app.core.sessions import SessionConfig
from app.core.tool_loop import (
    AssembledCall,
    PendingCall,
    RunTools,
    StopRun,
    assemble_calls,
    next_step,
    thread_call_id,
)
from app.core.usage import UsageReport
from app.db import approvals as approvals_db
from app.db import journal as journal_db
from app.db import runs as runs_db
from app.db import sessions as sessions_db
from app.db import steers as steers_db
from app.db.approvals import Approval
from app.db.engine import autocommit, read_snapshot
from app.db.outage import database_unavailable, retrying
from app.db.sessions import RunStart
from app.eventlog.registry import APPROACHING_LIMIT_SHARE, AT_LIMIT_SHARE, EventType
from app.llm.base import (
    Finish,
    ModelRequest,
    ProviderError,
    ReasoningBlock,
    ReasoningDelta,
    Restart,
    TextDelta,
    ToolCallDelta,
    prompt_cache_key,
)
from app.llm.catalog import model_labels
from app.runs.machine import committed_events
from app.services import mcp_servers as mcp_services
from app.services import run_transitions, steering
from app.services.errors import ServiceError
from app.services.journal import append_in
from app.services.projection import (
    SessionProjection,
    offered_tools,
    project_for_run,
    project_run_from,
    project_run_in,
)
from app.telemetry import carried, metrics
from app.tools import mcp as mcp_tools
from app.tools.registry import ToolContext, ToolOutcome, execute
from app.worker.compaction import (
    auto_compact,
    await_compaction_jobs,
    await_earlier_asks,
    compaction_job,
)
from app.worker.runtime import Runtime

log = logging.getLogger(__name__)
# Database outages one attempt waits out before it gives up (then its job fails, and the run
# is picked up again once the database is back: app/worker/pool.py).
MAX_OUTAGES = 5
PREVIEW_CHARS = 500
# Why a model call's partial answer was voided: `message.reset`'s reason, the rollback's.
RESTART_REASON = "provider_retry"
# The run error of an answer that does not follow the ask's JSON Schema.
STRUCTURED_OUTPUT_INVALID = "structured_output_invalid"


@dataclass
class _Progress:
    """What a run has received so far: committed as incomplete if it is stopped."""

    text: list[str] = field(default_factory=list)  # the current model turn's
    # The current model turn's content in stream order: text pieces and the reasoning blocks
    # it closed (journaled with the turn only once it completed: never a half block).
    parts: list[dict[str, Any]] = field(default_factory=list)
    restarts: int = 0  # model calls asked again after their output began (this attempt)
    first_output: bool = False  # its first output was seen (the first-token latency)
    usage: UsageReport | None = None  # summed over the run's model turns
    model: str | None = None
    # once a summary failed, or is still being written after the wait, this run only windows
    compaction_failed: bool = False
    # no steer was pending when the run started (start_first): the first look is spared
    unsteered: bool = False
    # the current model turn's context: its oldest history entry's seq (refs.context_from)
    context_from: int | None = None
    # what its first start read of its session (start_first), for its first step
    start: RunStart | None = None
    # The version and rev of its session's row its start read, while the run itself has not
    # written the row since: its end is then one statement if the row is still so (_finish).
    session_as_read: tuple[int, int] | None = None

    def add_usage(self, usage: UsageReport | None) -> None:
        if usage is not None:
            self.usage = usage.plus(self.usage)


async def execute_run(
    runtime: Runtime,
    run_id: str,
    abort_reason: Callable[[], str | None],
    *,
    kind: RunKind | None = None,
) -> None:
    """Execute a run. procrastinate stops a job by cancelling its task: a user's cancel ends
    the run `cancelled` with what arrived; a worker shutdown re-raises, so the job is retried
    and the run resumes elsewhere. `kind`, when the caller knows it (an ask's handoff), spares
    reading the run to learn whether it is a compaction."""
    try:
        if kind is not RunKind.ASK:
            await await_earlier_asks(runtime, run_id)  # a compaction job, queued behind asks
    except asyncio.CancelledError:
        if abort_reason() != "user_request":
            raise  # else: _claim ends the run cancelled
    claimed = await _claim(runtime, run_id)
    if claimed is not None:
        await execute_started(runtime, claimed, abort_reason)


async def execute_started(
    runtime: Runtime,
    run: Run,
    abort_reason: Callable[[], str | None],
    job_id: int | None = None,
    *,
    unsteered: bool = False,
    start: RunStart | None = None,
) -> bool:
    """Execute a run whose attempt this worker has started (start_locked, start_first). With
    `job_id` (the run's job, which the caller holds), the job is finished (succeeded) in the
    transaction that ends the run; True if it was. `unsteered`: its start found no steer
    pending (start_first), so its first model turn need not look again; `start`: what its
    start read of its session (start_first), so that its first step reads it not again."""
    with carried.run_scope(run):
        running = _execute(runtime, run, abort_reason, job_id, unsteered, start)
        del start  # the run's first step lets go of it (it may hold a long thread): so do we
        return await running


async def _execute(
    runtime: Runtime,
    run: Run,
    abort_reason: Callable[[], str | None],
    job_id: int | None = None,
    unsteered: bool = False,
    start: RunStart | None = None,
) -> bool:
    run_id, writer = run.id, runtime.writer
    writer.open(run_id, run.attempts)
    log.info("run %s: attempt %d started", run_id, run.attempts)
    progress = _Progress(
        model=run.model, first_output=run.attempts > 1, unsteered=unsteered, start=start
    )
    del start  # held by `progress` until the first step takes it, not for the run's life
    try:
        policy = RunPolicy.model_validate(run.params.run_policy or {})
        outcome: Outcome | Pause | AwaitApproval
        try:
            async with asyncio.timeout(policy.max_run_seconds):
                outcome = await _attempt(runtime, run, progress)
        except TimeoutError:
            limit = StopRun(
                "max_run_seconds", f"the run took longer than {policy.max_run_seconds} s"
            )
            outcome = await _violation(runtime, run, limit, progress)
            outcome = Outcome(
                "failed", "".join(progress.text), progress.usage, outcome.error, progress.model
            )
        except Superseded:
            log.warning("run %s: taken over by another worker; this attempt stops", run_id)
            return False
        except asyncio.CancelledError:
            if abort_reason() != "user_request":
                raise
            text = "".join(progress.text)
            outcome = Outcome("cancelled", text, progress.usage, model=progress.model)
        except Exception as exc:  # a bug must still end the run, clearly
            log.exception("run %s crashed", run_id)
            outcome = Outcome("failed", error={"code": "internal_error", "message": str(exc)})
        if isinstance(outcome, Outcome):  # its answer names the context it was written from
            outcome = replace(outcome, context_from=progress.context_from)
        # Its end is written whatever happens to the database meanwhile: retried until it is back.
        if isinstance(outcome, Pause | AwaitApproval):
            await retrying(lambda: _pause(runtime, run, outcome))
            return False
        ended = await retrying(
            lambda: _finish(runtime, run, outcome, job_id, progress.session_as_read)
        )
        log.info("run %s: %s", run_id, outcome.status)
        return ended
    finally:
        writer.close(run_id)


async def _attempt(
    runtime: Runtime, run: Run, progress: _Progress
) -> Outcome | Pause | AwaitApproval:
    """The run's work. A database that cannot be reached mid-run (a restart, a failover) is
    waited for, then the work goes on from what the journal holds; clients are told to drop
    the partial answer they saw (`message.reset`), which streams again."""
    outages = 0
    while True:
        try:
            if run.kind is RunKind.COMPACTION:
                return await compaction_job(runtime, run)
            return await _converse(runtime, run, progress)
        except Exception as exc:
            if not database_unavailable(exc) or outages >= MAX_OUTAGES:
                raise
            outages += 1
            log.warning("run %s: the database cannot be reached; resuming once it is back", run.id)
        await retrying(lambda: _ping(runtime))
        progress.text, progress.parts = [], []
        runtime.writer.emit(
            run.id, EventType.MESSAGE_RESET, {"reason": "retry", "attempt": run.attempts}
        )


async def _ping(runtime: Runtime) -> None:
    async with runtime.engine.connect() as conn:
        await conn.execute(text("SELECT 1"))


class Superseded(Exception):
    """Another worker took the run over (this one was thought dead): it stops writing."""


def _check_fence(runtime: Runtime, run_id: str) -> None:
    if run_id in runtime.writer.superseded:
        raise Superseded(run_id)


async def _finish(
    runtime: Runtime,
    run: Run,
    outcome: Outcome,
    job_id: int | None,
    session_as_read: tuple[int, int] | None = None,
) -> bool:
    """End the run; with `job_id`, its job too (the run's row, then the job's: a cancel's
    order). True if the job was finished here. `session_as_read`: the version and rev of its
    session's row as the run read it (and `run` as this worker started it): if both rows are
    still so, the end is one statement (no transaction, no lock taken first); else it is
    written under their locks, from the rows as they are then."""
    await runtime.writer.flush()
    written: list[dict[str, Any]] = []
    with runtime.writer.committing([run.id]):
        if session_as_read is not None:
            version, rev = session_as_read
            try:
                async with autocommit(runtime.engine) as conn:
                    await run_transitions.finish(
                        conn, run, outcome, written, job_id, rev, session_as_read=version
                    )
                    await conn.commit()  # behind a transaction pooler, autocommit is not set
            except runs_db.Changed:
                written.clear()  # nothing was written: under the locks, then
            else:
                runtime.writer.publish(written)
                return job_id is not None
        async with runtime.engine.begin() as conn:
            found = await runs_db.lock_with_rev(conn, run.id)
            if found is None or not found[0].active or found[0].attempts != run.attempts:
                # ended meanwhile (a cancel after this worker was thought dead), or taken over
                return False
            locked, rev = found
            await run_transitions.finish(conn, locked, outcome, written, job_id, session_rev=rev)
        runtime.writer.publish(written)  # committed: this process's followers have them now
    return job_id is not None


async def _pause(runtime: Runtime, run: Run, pause: Pause | AwaitApproval) -> None:
    """Park the run in requires_action until the client posts the outputs, or in
    awaiting_approval until a person rules on the calls (or it expires)."""
    await runtime.writer.flush()
    settings = runtime.settings
    async with runtime.engine.begin() as conn:
        locked = await runs_db.get_run(conn, run.id, lock=True)
        if locked is None or not locked.active or locked.attempts != run.attempts:
            return
        if locked.cancel_mode:
            await run_transitions.finish(conn, locked, Outcome("cancelled"))
            return
        calls = [
            {"tool_call_id": c.tool_call_id, "name": c.name, "arguments": c.arguments}
            for c in pause.calls
        ]
        if isinstance(pause, AwaitApproval):
            timeout = settings.tool_approval_timeout_seconds
            await run_transitions.await_approval(conn, locked, calls, timeout)
        else:
            timeout = settings.tool_outputs_timeout_seconds
            await run_transitions.await_tool_outputs(conn, locked, calls, timeout)


async def _claim(runtime: Runtime, run_id: str) -> Run | None:
    """Start an attempt (a retry, if an earlier one died mid-run), or end a run that was
    cancelled before it started; None: nothing to do."""
    async with runtime.engine.begin() as conn:
        return await start_locked(conn, runtime, await runs_db.get_run(conn, run_id, lock=True))


async def start_first(runtime: Runtime, run_id: str) -> runs_db.FirstStart | None:
    """The start of a run never started and not being cancelled (an ask's run this process
    committed taken): one statement, its event handed to this process's followers at once;
    None: not such a run (start it under its row's lock: start_locked)."""
    written: list[dict[str, Any]] = []
    with runtime.writer.committing([run_id]):
        async with autocommit(runtime.engine) as conn:
            first = await run_transitions.start_first(conn, run_id, runtime.lease.key, written)
            await conn.commit()  # behind a transaction pooler, autocommit is not set
        runtime.writer.publish(written)
    return first


async def start_locked(conn: AsyncConnection, runtime: Runtime, run: Run | None) -> Run | None:
    """With the run's row locked in `conn`'s transaction: start its attempt under this
    worker's lease, or end it if it was cancelled before it started; None: nothing to run."""
    if run is None or not run.active:
        return None
    if run.cancel_mode:
        await run_transitions.finish(conn, run, Outcome("cancelled"))
        return None
    started = await run_transitions.start(conn, run, runtime.lease.key)
    return started if started.active else None


@dataclass(frozen=True)
class Pause:
    """The run waits for the client to run these calls (client-side tools)."""

    calls: tuple[PendingCall, ...]


@dataclass(frozen=True)
class AwaitApproval:
    """The run waits for a person to rule on these calls (their tools' rule is `ask`)."""

    calls: tuple[PendingCall, ...]


async def _converse(
    runtime: Runtime, run: Run, progress: _Progress
) -> Outcome | Pause | AwaitApproval:
    """Model turns and tool calls until a final answer, a failure or a limit; each step is
    decided from what the journal holds, so a retried run picks up where this one stopped."""
    session_id = run.session_id
    policy = RunPolicy.model_validate(run.params.run_policy or {})
    # Read once: a run keeps the tools it started with, and the session's earlier spending.
    # With them, in one snapshot: the compactions queued before it, what the run has written
    # so far (only this run writes it: a wait does not change it), and the projection of its
    # first model call (from the same session row, not read twice).
    # Most starts need that one statement alone: it also reads the thread's newest entries,
    # which a short thread, or one whose newest entries fill the budget, projects from.
    first: SessionProjection | ServiceError | None = None
    start, progress.start = progress.start, None  # its start's read, for its first step only
    if start is None:
        async with autocommit(runtime.engine) as conn:
            start = await sessions_db.read_for_run(
                conn, run.tenant_id, session_id, run.id, run.input_seq
            )
    if start.session is not None and not start.compacting and start.newest is not None:
        try:
            first = await project_run_from(runtime.settings, start.session, run, start.newest)
        except ServiceError as exc:  # the model turn reports it, if there is one
            first = exc
    compactions: list[Run] = []
    if start.session is not None and first is None:
        # Further back, a fork's ancestors, memory, compactions under way: all in one snapshot.
        async with read_snapshot(runtime.engine) as conn:
            start = await sessions_db.read_for_run(
                conn, run.tenant_id, session_id, run.id, run.input_seq, with_newest=False
            )
            if start.compacting:
                compactions = await runs_db.active_runs(
                    conn, session_id, kind="compaction", tenant_id=run.tenant_id
                )
            if start.session is not None:
                try:
                    first = await project_run_in(conn, runtime.settings, start.session, run)
                except ServiceError as exc:
                    first = exc
    session = start.session
    if session is not None and start.version is not None:
        progress.session_as_read = (start.version, session.rev)
    written: list[JournalEntry] | None = start.written
    del start  # its newest entries (a whole thread, handed by the ask) are the first step's
    config = session.config if session is not None else SessionConfig()
    servers: dict[str, McpServer] = {}
    if run.kind is RunKind.ASK and run.params.mcp_server_names(config.mcp_servers):
        run, servers, rules = await _with_mcp_tools(runtime, run, config)
        policy = policy.with_tool_rules(rules)
        first = None  # projected again, with the servers' tools
        progress.unsteered = False  # listing the tools took a while: look before the turn
    tools = offered_tools(config, run.params.tools)
    tokens_before = session.tokens_used if session is not None else 0
    if any(r.created_at < run.created_at for r in compactions):
        first = None  # a compaction queued before it changes the context: projected again
    if compactions:
        progress.unsteered = False  # waiting for them may take a while: look before the turn
    if await await_compaction_jobs(runtime, run, config, compactions):
        progress.compaction_failed = True  # one is still summarizing: no second one meanwhile
    while True:
        projected, first = first, None  # only ever the first step's
        if written is not None:  # the first step's, read above
            done, written = written, None
        else:
            async with autocommit(runtime.engine) as conn:
                done = await journal_db.run_entries(
                    conn, session_id, run.input_seq, run.id, tenant_id=run.tenant_id
                )
        step = _over_budget(policy, tokens_before, progress) or next_step(
            done, policy.max_iterations
        )
        if isinstance(step, RunTools):
            client = {t["name"] for t in tools if t.get("kind") == "client"}
            server_side = tuple(c for c in step.calls if c.name not in client)
            if not server_side:  # only the client can answer these: wait for its outputs
                return Pause(step.calls)
            gated = [c for c in server_side if policy.needs_approval(c.name)]
            rulings = await _rulings(runtime, run.id) if gated else {}
            # Calls nobody ruled on yet wait; the others (and the ruled ones) go ahead now.
            waiting = tuple(c for c in gated if _undecided(rulings.get(c.tool_call_id)))
            ready = tuple(c for c in server_side if c not in waiting)
            denied = await _run_tools(runtime, run, ready, tools, policy, rulings, servers)
            if denied and policy.on_denied == "stop":
                step = StopRun("tool_denied", f"the policy does not allow {', '.join(denied)}")
            elif waiting:
                return AwaitApproval(waiting)
            else:
                progress.session_as_read = None  # its tools' outputs were appended
                continue
        if isinstance(step, StopRun):
            return await _violation(runtime, run, step, progress)
        if await _deliver_steers(runtime, run, step.iteration, progress):
            projected = None  # the context now ends with the steered message
        outcome = await _model_turn(runtime, run, step.iteration, progress, projected)
        if outcome is not None:
            return outcome
        progress.session_as_read = None  # its tool calls were appended


async def _with_mcp_tools(
    runtime: Runtime, run: Run, config: SessionConfig
) -> tuple[Run, dict[str, McpServer], dict[str, ApprovalRule]]:
    """The run with its MCP servers' tools among its own (in memory: its stored params keep
    the names only), the servers by name, and the approval rules their tools get from the
    servers' own `require_approval`. Fetched once per run (a short-lived cache across runs);
    what is left out, and why, is a context.warning, never a failed run."""
    names = [*(config.mcp_servers or []), *run.params.mcp_servers]
    async with autocommit(runtime.engine) as conn:
        servers, missing = await mcp_services.resolve(
            conn, runtime.settings, run.tenant_id, names, run.params.mcp_inline
        )
    settings = runtime.settings
    listing = await mcp_tools.list_tools(
        servers,
        settings.outbound_allowed,
        seconds=settings.mcp_timeout_seconds,
        ttl=settings.mcp_tools_ttl_seconds,
    )
    warnings = [f"no MCP server is named {name}" for name in missing] + listing.warnings
    for warning in warnings:
        runtime.writer.emit(
            run.id, EventType.CONTEXT_WARNING, {"level": "tools_left_out", "message": warning}
        )
    params = replace(run.params, tools=[*listing.tools, *run.params.tools])
    return replace(run, params=params), {s.name: s for s in servers}, listing.approvals


async def _deliver_steers(runtime: Runtime, run: Run, iteration: int, progress: _Progress) -> bool:
    """Journal the messages sent to the run while it worked (steers), before the model turn
    `iteration`, which then sees them; True if there were any."""
    if progress.unsteered:  # its start found none: a steer sent since is found next time
        progress.unsteered = False
        return False
    async with autocommit(runtime.engine) as conn:
        if not await steers_db.any_pending(conn, run.id):
            return False
    progress.session_as_read = None  # journaled below
    async with runtime.engine.begin() as conn:
        delivered = await steering.deliver_in(conn, run)
    for steer_id, entry in delivered:
        data = {"steer_id": steer_id, "entry_seq": int(entry["seq"]), "iteration": iteration}
        data["text"] = text_of(entry["payload"]["content"])
        runtime.writer.emit(run.id, EventType.RUN_STEERED, data, urgent=True)
    for kind, data in committed_events([entry for _, entry in delivered]):
        runtime.writer.emit(run.id, kind, data)
    return bool(delivered)


def _over_budget(policy: RunPolicy, tokens_before: int, progress: _Progress) -> StopRun | None:
    """The session's token limit, counting this run's model turns so far."""
    used = progress.usage.input_tokens + progress.usage.output_tokens if progress.usage else 0
    if policy.max_total_tokens is not None and tokens_before + used >= policy.max_total_tokens:
        return StopRun(
            "max_total_tokens",
            f"the session reached its limit of {policy.max_total_tokens} tokens",
        )
    return None


async def _violation(runtime: Runtime, run: Run, stop: StopRun, progress: _Progress) -> Outcome:
    """Record the broken limit in the journal and end the run with it."""
    progress.session_as_read = None  # journaled below
    run_id = run.id
    violation = {"rule": stop.rule, "message": stop.message}
    entry = NewEntry(
        EntryKind.POLICY_VIOLATION, violation, {"run_id": run_id}, entry_id(run_id, stop.rule)
    )
    await _commit(runtime, run, [entry])
    error = {"code": "policy_violation", **violation}
    return Outcome("failed", usage=progress.usage, error=error, model=progress.model)


async def _model_turn(
    runtime: Runtime,
    run: Run,
    iteration: int,
    progress: _Progress,
    read: SessionProjection | ServiceError | None = None,
) -> Outcome | None:
    """One model call; an Outcome if the run ends with it, None if it asked for tools (then
    committed as one assistant turn: its text and one tool_call entry per call). `read`: its
    projection (or why there is none), when the caller has just made it."""
    run_id, params = run.id, run.params
    try:
        if isinstance(read, ServiceError):
            raise read
        projected = read or await _project(runtime, run)
        meta = projected.projection.meta
        _warn_if_full(runtime, run_id, meta)
        auto = projected.policy.summarization == "auto"
        if auto and meta.needs_summary and not progress.compaction_failed:
            compacted = await auto_compact(runtime, run, projected)
            progress.compaction_failed = compacted.failed
            if compacted.summary is not None:
                progress.add_usage(compacted.summary.usage)
                projected = await _project(runtime, run)
    except ServiceError as exc:  # e.g. the context overflowed while the run was queued
        return Outcome(
            "failed", usage=progress.usage, error={"code": exc.code, "message": exc.message}
        )
    projection = projected.projection
    progress.context_from = projection.meta.window_start_seq
    request = ModelRequest(
        model=run.model.partition(":")[2],
        messages=projection.messages,
        tools=projection.tool_spec,
        max_output_tokens=params.max_output_tokens,
        temperature=params.temperature,
        answer_room=projected.policy.reserve,
        cache_breakpoints=projection.meta.cache_breakpoints,
        cache_key=prompt_cache_key(run.session_id),
        tool_choice=tool_choices.for_turn(params.tool_choice, iteration),
        parallel_tool_calls=params.parallel_tool_calls,
        reasoning=Reasoning.model_validate(params.reasoning) if params.reasoning else None,
        response_format=ResponseFormat.model_validate(params.response_format)
        if params.response_format
        else None,
    )
    progress.text, progress.parts = [], []
    thinking: set[int] = set()  # reasoning blocks whose start was announced
    pieces: list[tuple[int, str | None, str | None, str]] = []
    user_seq = run.input_seq
    finish: FinishReason | None = None
    positions: dict[int, int] = {}  # a streamed call's index -> its place in the turn
    # restarts: a transient fault after output began is retried too; tools only ever run
    # after a model turn that completed, so no call is executed for a voided attempt.
    stream = runtime.router.stream(
        run.model, request, fallback=params.fallback_model, restarts=True
    )
    try:
        async for model, event in stream:
            _check_fence(runtime, run_id)
            progress.model = model
            if isinstance(event, Restart):
                await _void_attempt(runtime, run, iteration, progress, event.error)
                pieces, positions, finish, thinking = [], {}, None, set()
            elif isinstance(event, TextDelta) and event.text:
                progress.first_output = progress.first_output or metrics.first_token(
                    run.created_at, model_labels(model)[0]
                )
                progress.text.append(event.text)
                _add_text(progress.parts, event.text)
                runtime.writer.emit(run_id, EventType.MESSAGE_DELTA, {"text": event.text})
            elif isinstance(event, ReasoningDelta | ReasoningBlock):
                _reasoning_event(
                    runtime, run_id, event, thinking, progress.parts, calls_made=len(positions)
                )
            elif isinstance(event, ToolCallDelta):
                pieces.append((event.index, event.id, event.name, event.arguments))
                delta = {"index": event.index, "arguments": event.arguments}
                if event.index not in positions:  # its first piece: name it as it is journaled
                    positions[event.index] = len(positions)
                    delta["tool_call_id"] = thread_call_id(
                        user_seq, iteration, positions[event.index]
                    )
                if event.name:
                    delta["name"] = event.name
                runtime.writer.emit(run_id, EventType.TOOL_CALL_DELTA, delta)
            elif isinstance(event, UsageReport):
                progress.add_usage(event)
            elif isinstance(event, Finish):
                finish = event.neutral
    except ProviderError as exc:
        error = exc.as_error()
        return Outcome(
            "failed", "".join(progress.text), progress.usage, error=error, model=progress.model
        )
    calls = assemble_calls(pieces, user_seq, iteration)
    content = _turn_content("".join(progress.text), progress.parts)
    if not calls:
        text = "".join(progress.text)
        parts = tuple(content) if isinstance(content, list) else ()
        if request.response_format is not None:
            return _structured(request.response_format, text, parts, finish, progress)
        return Outcome(
            "completed",
            text,
            progress.usage,
            model=progress.model,
            finish_reason=finish,
            parts=parts,
        )
    turn = _tool_turn(run_id, iteration, content, calls, finish, progress.context_from)
    await _commit(runtime, run, turn)
    for entry in turn:  # a call with unusable arguments, answered with the turn: its result
        if entry.kind == EntryKind.TOOL_RESULT:
            result = {
                "tool_call_id": entry.refs["tool_call_id"],
                "name": entry.payload["name"] or "unnamed",
                "is_error": True,
                "preview": str(entry.payload["content"])[:PREVIEW_CHARS],
            }
            runtime.writer.emit(run_id, EventType.TOOL_RESULT, result)
    progress.text, progress.parts = [], []  # committed with its calls: not the final answer
    return None


def _structured(
    format: ResponseFormat,
    text: str,
    parts: tuple[dict[str, Any], ...],
    finish: FinishReason | None,
    progress: _Progress,
) -> Outcome:
    """The end of a run whose answer must follow a JSON Schema: completed when it does, else
    failed with `structured_output_invalid` (the answer kept, marked incomplete)."""
    mark = format.mark()
    problem = answer_problem(format.schema_, text)
    if problem is None:
        return Outcome(
            "completed",
            text,
            progress.usage,
            model=progress.model,
            finish_reason=finish,
            parts=parts,
            structured=mark,
        )
    cut = " (the answer was cut off by the output limit)" if finish == "length" else ""
    error = {
        "code": STRUCTURED_OUTPUT_INVALID,
        "message": f"the answer does not follow the schema {format.name!r}: {problem}{cut}",
    }
    return Outcome("failed", text, progress.usage, error, progress.model, finish, structured=mark)


def _add_text(parts: list[dict[str, Any]], text: str) -> None:
    if parts and parts[-1]["type"] == "text":
        parts[-1]["text"] += text
    else:
        parts.append({"type": "text", "text": text})


def _reasoning_event(
    runtime: Runtime,
    run_id: str,
    event: ReasoningDelta | ReasoningBlock,
    thinking: set[int],
    parts: list[dict[str, Any]],
    calls_made: int,
) -> None:
    """Stream a reasoning piece (`reasoning.delta`, with its block's start and end) and keep
    a closed block in the turn's content, where it stands among the text; a block the model
    wrote after some of the turn's tool calls (interleaved thinking) records how many
    (`tool_calls_before`), so that it goes back in its place among them."""
    data: dict[str, Any] = {"index": event.index, "text": ""}
    if event.index not in thinking:
        thinking.add(event.index)
        data["start"] = True
    if isinstance(event, ReasoningDelta):
        data["text"] = event.text
    else:
        part = dict(event.part)
        if calls_made:
            part[TOOL_CALLS_BEFORE] = calls_made
        parts.append(part)
        data["end"] = True
        if event.part["type"] == "redacted_thinking":
            data["redacted"] = True
    runtime.writer.emit(run_id, EventType.REASONING_DELTA, data)


def _turn_content(text: str, parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """A model turn's content as journaled: its text, or, when it reasoned, its parts in the
    order they came (blank text left out: providers refuse it, and it says nothing)."""
    if not any(p["type"] != "text" for p in parts):
        return text
    return [p for p in parts if p["type"] != "text" or p["text"].strip()]


async def _void_attempt(
    runtime: Runtime, run: Run, iteration: int, progress: _Progress, error: ProviderError
) -> None:
    """A model call failed after its output began and was asked again (the same request):
    what it wrote is journaled as an incomplete answer and rolled back at once, so that no
    projection (nor a summary) ever sends it, and clients are told to drop it."""
    progress.restarts += 1
    progress.session_as_read = None  # the partial answer is journaled below
    text, progress.text, progress.parts = "".join(progress.text), [], []
    log.warning(
        "run %s: the model call failed after its output began (%s: %s); asked again",
        run.id,
        error.kind,
        error.message,
    )
    if text:
        part = f"{iteration}:restart:{run.attempts}.{progress.restarts}"
        refs = {"run_id": run.id, "call_id": f"{run.id}:{iteration}", "iteration": iteration}
        said = {"role": "assistant", "content": text, "status": "incomplete"}
        partial = NewEntry(EntryKind.MESSAGE, said, refs, entry_id(run.id, part))
        async with runtime.engine.begin() as conn:
            first = await append_in(conn, run.tenant_id, run.session_id, [partial])
            seq = int(first.entries[0]["seq"])
            taken_back = {"from_seq": seq, "to_seq": seq, "reason": RESTART_REASON}
            rollback = NewEntry(
                EntryKind.ROLLBACK,
                taken_back,
                {"run_id": run.id},
                entry_id(run.id, f"{part}:rollback"),
            )
            second = await append_in(conn, run.tenant_id, run.session_id, [rollback])
        for kind, data in committed_events([*first.entries, *second.entries]):
            runtime.writer.emit(run.id, kind, data)
    runtime.writer.emit(
        run.id, EventType.MESSAGE_RESET, {"reason": RESTART_REASON, "attempt": run.attempts}
    )


async def _project(runtime: Runtime, run: Run) -> SessionProjection:
    return await project_for_run(runtime.engine, runtime.settings, run)


def _tool_turn(
    run_id: str,
    iteration: int,
    content: str | list[dict[str, Any]],
    calls: list[AssembledCall],
    finish: FinishReason | None,
    context_from: int | None,
) -> list[NewEntry]:
    turn = f"{run_id}:{iteration}"
    refs: dict[str, Any] = {"run_id": run_id, "call_id": turn, "iteration": iteration}
    if context_from is not None:
        refs["context_from"] = context_from
    entries = []
    if content:  # its text and reasoning: one assistant message, before its calls
        said: dict[str, Any] = {"role": "assistant", "content": content}
        if finish is not None:
            said["finish_reason"] = finish
        entries.append(
            NewEntry(
                EntryKind.MESSAGE,
                said,
                refs,
                entry_id(run_id, f"{iteration}:text"),
            )
        )
    for call in calls:
        call_id = call.tool_call_id
        call_refs = {**refs, "tool_call_id": call_id}
        if call.upstream_id:
            call_refs["upstream_tool_call_id"] = call.upstream_id[:128]
        entries.append(
            NewEntry(
                EntryKind.TOOL_CALL,
                {"name": call.name or "unnamed", "arguments": call.arguments or {}},
                call_refs,
                entry_id(run_id, f"{iteration}:call:{call_id}"),
            )
        )
        if call.arguments is None:  # unusable arguments: answered at once, the model can retry
            message = f"Error: the arguments are not a JSON object: {call.raw_arguments[:500]}"
            entries.append(
                NewEntry(
                    EntryKind.TOOL_RESULT,
                    {"name": call.name, "content": message, "is_error": True},
                    {k: v for k, v in call_refs.items() if k != "context_from"},  # not the model's
                    entry_id(run_id, f"result:{call_id}"),
                )
            )
    return entries


async def _rulings(runtime: Runtime, run_id: str) -> dict[str, Approval]:
    async with autocommit(runtime.engine) as conn:
        return {a.tool_call_id: a for a in await approvals_db.of_run(conn, run_id)}


def _undecided(approval: Approval | None) -> bool:
    return approval is None or approval.decision is None


async def _run_tools(
    runtime: Runtime,
    run: Run,
    calls: tuple[PendingCall, ...],
    tools: list[Any],
    policy: RunPolicy,
    rulings: dict[str, Approval],
    servers: Mapping[str, McpServer],
) -> list[str]:
    """Execute a turn's unanswered calls concurrently and commit one result per call; returns
    the names of calls the policy refused (they get an error result instead). A call that
    waited for approval runs only if it was approved, with the arguments it was approved with,
    and at most once (approvals_db.claim_execution); else the model reads why it did not."""
    run_id = run.id
    denied = [c.name for c in calls if not policy.allows(c.name)]
    for call in calls:
        ruling = rulings.get(call.tool_call_id)
        arguments = ruling.effective_arguments if ruling is not None else call.arguments
        runtime.writer.emit(
            run_id,
            EventType.TOOL_CALL,
            {"tool_call_id": call.tool_call_id, "name": call.name, "arguments": arguments},
            urgent=True,
        )

    async def settle(call: PendingCall) -> None:
        # Each result is committed the moment its tool returns: if the worker dies while a
        # slower call runs, the finished ones are never executed again.
        _check_fence(runtime, run_id)
        ruling = rulings.get(call.tool_call_id)
        if not policy.allows(call.name):
            outcome = _refused(call.name)
        elif ruling is not None:
            outcome = await _run_ruled(runtime, run, call, tools, ruling, servers)
        else:
            context = ToolContext(
                run.tenant_id,
                run.session_id,
                run_id,
                call.tool_call_id,
                runtime.engine,
            )
            outcome = await execute(
                call, tools, context, settings=runtime.settings, mcp_servers=servers
            )
        runtime.writer.emit(
            run_id,
            EventType.TOOL_RESULT,
            {
                "tool_call_id": call.tool_call_id,
                "name": call.name,
                "is_error": outcome.is_error,
                "preview": result_text(outcome.content)[:PREVIEW_CHARS],
            },
        )
        refs = {
            "run_id": run_id,
            "call_id": f"{run_id}:{call.iteration}",
            "tool_call_id": call.tool_call_id,
            "iteration": call.iteration,
        }
        payload = {"name": call.name, "content": outcome.content, "is_error": outcome.is_error}
        result_id = entry_id(run_id, f"result:{call.tool_call_id}")
        await _commit(runtime, run, [NewEntry(EntryKind.TOOL_RESULT, payload, refs, result_id)])

    await asyncio.gather(*(settle(call) for call in calls))
    return denied


async def _run_ruled(
    runtime: Runtime,
    run: Run,
    call: PendingCall,
    tools: list[Any],
    ruling: Approval,
    servers: Mapping[str, McpServer],
) -> ToolOutcome:
    """A call a person ruled on: the rejection or expiry the model reads, or the approved
    call run once. The claim is committed before the tool starts: a worker that dies while it
    runs leaves it claimed, and the retried run reports it interrupted instead of running it
    again. Whatever the tool's kind (built-in, webhook, MCP): `execute` picks the way."""
    if ruling.decision == "rejected":
        return ToolOutcome(approval_texts.rejected_text(ruling.reason), is_error=True)
    if ruling.decision != "approved":
        return ToolOutcome(approval_texts.EXPIRED_TEXT, is_error=True)
    async with runtime.engine.begin() as conn:
        claimed = await approvals_db.claim_execution(conn, run.id, call.tool_call_id)
    if not claimed:
        return ToolOutcome(approval_texts.INTERRUPTED_TEXT, is_error=True)
    approved = replace(call, arguments=ruling.effective_arguments)
    context = ToolContext(run.tenant_id, run.session_id, run.id, call.tool_call_id, runtime.engine)
    outcome = await execute(
        approved, tools, context, settings=runtime.settings, mcp_servers=servers
    )
    if ruling.edited_arguments is None:
        return outcome
    note = approval_texts.edited_note(ruling.edited_arguments)
    return ToolOutcome(note + result_text(outcome.content), is_error=outcome.is_error)


def _refused(name: str) -> ToolOutcome:
    return ToolOutcome(f"Error: the policy does not allow the tool {name!r}.", is_error=True)


async def _commit(runtime: Runtime, run: Run, entries: list[NewEntry]) -> None:
    """Append a step's entries (idempotent: ids derive from the run) and announce them."""
    async with runtime.engine.begin() as conn:
        appended = await append_in(conn, run.tenant_id, run.session_id, entries)
    for kind, data in committed_events(appended.entries):
        runtime.writer.emit(run.id, kind, data)


def _warn_if_full(runtime: Runtime, run_id: str, meta: ProjectionMeta) -> None:
    """Before any compaction: approaching_limit from 80% of the budget; at_limit when the
    history no longer fits whole (the projection had to leave some out) or fills it."""
    tokens, budget = meta.estimated_tokens, meta.budget
    share = tokens / budget if budget else 0.0
    if share >= APPROACHING_LIMIT_SHARE or meta.truncated:
        at_limit = share >= AT_LIMIT_SHARE or meta.truncated
        level = "at_limit" if at_limit else "approaching_limit"
        runtime.writer.emit(
            run_id,
            EventType.CONTEXT_WARNING,
            {
                "level": level,
                "tokens": tokens,
                "budget": budget,
                "percent": round(100 * share, 1),
                "history_dropped": meta.truncated,
            },
        )
