"""Asks and cancels: validate, then commit the user's entry, the run and its job at once.

Validate → commit → project: a rejected ask (bad input, policy, busy session, context overflow)
writes nothing; an accepted one is committed before any model is called, so a failed call still
leaves the user's words in the journal.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.config import Settings
from app.core import run_policy as run_policies
from app.core.content import content_problems
from app.core.entries import EntryKind
from app.core.projection import PendingEntry
from app.core.tool_choice import ToolChoice
from app.db import jobs as jobs_db
from app.db import runs as runs_db
from app.db import sessions as sessions_db
from app.llm.router import tool_choice_problem
from app.runs.model import CancelMode, Run, RunKind, RunParams, entry_id
from app.services import quotas
from app.services import run_transitions as runs  # named so until the ask path is rewritten
from app.services.errors import Conflict, Invalid, entries_refused, session_not_found
from app.services.journal import NewEntry, append_in
from app.services.projection import project_session
from app.telemetry import metrics

Strategy = Literal["reject", "enqueue", "interrupt", "rollback"]
# How long a `rollback` ask waits for the run it replaces to stop before giving up (409).
ROLLBACK_WAIT_SECONDS = 15.0


@dataclass(frozen=True)
class AskParams:
    content: str | list[dict[str, Any]]
    model: str | None = None
    context_policy: dict[str, Any] | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    multitask_strategy: Strategy = "reject"
    on_disconnect: Literal["continue", "cancel"] = "continue"
    idempotency_key: str | None = None
    run_policy: dict[str, Any] | None = None
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: ToolChoice = "auto"  # forced choices hold for the first model turn only
    parallel_tool_calls: bool = True
    # Entries committed with the ask, before its user message (a client that sends history
    # along with its question); each gets refs.request_id = the run's id.
    before: tuple[PendingEntry, ...] = ()


@dataclass(frozen=True)
class AskResult:
    run: Run
    created: bool  # False: an earlier ask with the same Idempotency-Key
    claimed: bool = False  # its job was taken at once by `claim_for` (ask()): it must start it


@metrics.counted_ask
async def ask(
    engine: AsyncEngine,
    settings: Settings,
    tenant_id: str,
    session_id: str,
    params: AskParams,
    own_limits: quotas.Limits | None = None,
    claim_for: int | None = None,
) -> AskResult:
    """`own_limits`: the tenant's own limits when the caller read them already (with the
    request's key); else the quota check reads them. `claim_for`: a procrastinate worker id of
    this process with room for the run: its job is committed taken by that worker when the
    session's queue allows (then `claimed`: the caller starts the run, app/worker/handoff.py)."""
    if params.idempotency_key:
        key = params.idempotency_key
        earlier = await run_by_idempotency_key(engine, tenant_id, session_id, key)
        if earlier is not None:
            return AskResult(earlier, created=False)
    user_payload = {"role": "user", "content": params.content}
    # Validation, before anything is written: the content suits every provider, the policy
    # resolves, and the ask fits.
    refused = [p.as_error("input") for p in content_problems("user", params.content)]
    if refused:
        raise entries_refused(refused)
    checked = await project_session(
        engine,
        settings,
        tenant_id,
        session_id,
        pending=[*params.before, PendingEntry("message", user_payload)],
        policy=params.context_policy,
        model=params.model,
        extra_tools=params.tools,
    )
    offered = [t.name for t in checked.projection.tool_spec]
    unserved = tool_choice_problem(checked.model, params.tool_choice, offered)
    if unserved is not None:
        details = {"loc": ["body", "tool_choice"], "model": checked.model, "tools": offered}
        raise Invalid("invalid_tool_choice", unserved, details)
    if params.multitask_strategy == "rollback":
        # Before stopping anything: a refused ask leaves the running run alone.
        await check_quotas(
            engine, settings, tenant_id, replacing_runs_of=session_id, own_limits=own_limits
        )
        await _stop_active_runs(engine, tenant_id, session_id, "rollback")

    async def commit(claim: int | None) -> AskResult:
        async with engine.begin() as conn:
            queued = await _commit(
                conn, settings, tenant_id, session_id, params, checked.model, own_limits, claim
            )
        return AskResult(queued.run, True, queued.claimed)

    try:
        try:
            return await commit(claim_for)
        except IntegrityError as exc:
            if claim_for is None or jobs_db.UNREGISTERED_WORKER not in str(exc.orig):
                raise
        # The worker this process registered was pruned meanwhile (after a database outage):
        # the job is queued for whichever worker fetches it, as when the handoff has no room.
        return await commit(None)
    except IntegrityError as exc:
        if "runs_idempotency_key" not in str(exc.orig) or not params.idempotency_key:
            raise
    # A concurrent ask with the same key won the race: answer with its run.
    earlier = await run_by_idempotency_key(engine, tenant_id, session_id, params.idempotency_key)
    assert earlier is not None
    return AskResult(earlier, created=False)


async def check_quotas(
    engine: AsyncEngine,
    settings: Settings,
    tenant_id: str,
    replacing_runs_of: str | None = None,
    own_limits: quotas.Limits | None = None,
) -> None:
    """Whether the tenant's quotas allow an ask now (429 if not), for a caller with other work
    to do before the ask (a rollback): the ask's commit checks again. `replacing_runs_of`: a
    session whose active ask runs the ask will stop (they do not count against it)."""
    async with engine.begin() as conn:
        replacing = (
            len(await runs_db.active_runs(conn, replacing_runs_of, kind="ask"))
            if replacing_runs_of is not None
            else 0
        )
        await quotas.check_ask(conn, settings, tenant_id, replacing=replacing, own=own_limits)


async def _commit(
    conn: AsyncConnection,
    settings: Settings,
    tenant_id: str,
    session_id: str,
    params: AskParams,
    model: str,
    own_limits: quotas.Limits | None,
    claim_for: int | None,
) -> runs_db.QueuedRun:
    """The user entry, run_start, the run, run.created and the job: one transaction."""
    session = await sessions_db.get_session(conn, tenant_id, session_id, lock=True)
    if session is None:
        raise session_not_found(session_id)
    policy = run_policies.merged(session["config"].get("run_policy"), params.run_policy)
    # Counting the session's turns is a query: only made when a turn limit is set.
    turns = await runs_db.count_asks(conn, session_id) if policy.max_turns is not None else 0
    refused = run_policies.violation_before_ask(
        policy, turns, int(session["input_tokens"]) + int(session["output_tokens"])
    )
    if refused is not None:
        rule, message = refused
        raise Conflict("policy_violation", message, {"rule": rule})
    # A compaction in flight is no reason to refuse: the ask's job queues behind it.
    active = await runs_db.active_runs(conn, session_id, kind="ask")
    if active and params.multitask_strategy == "reject":
        raise Conflict(
            "session_busy",
            "the session has a run in progress; cancel it or ask with another multitask_strategy",
            {"active_run_id": active[-1].id},
        )
    stopping = 0  # interrupted runs still winding down: this ask takes their place
    if params.multitask_strategy == "interrupt":
        for run in active:
            stopping += (await runs.request_cancel(conn, run, "interrupt")).active
    # Last before writing: it locks the tenant's row (when runs at once are limited) until the
    # commit, so concurrent asks of the tenant count each other's runs.
    await quotas.check_ask(conn, settings, tenant_id, replacing=stopping, own=own_limits)
    run_id = str(uuid.uuid4())
    refs = {"run_id": run_id}
    before = [
        NewEntry(
            EntryKind(e.kind),
            e.payload,
            {**e.refs, "request_id": run_id},
            entry_id(run_id, f"before:{i}"),
        )
        for i, e in enumerate(params.before)
    ]
    appended = await append_in(
        conn,
        tenant_id,
        session_id,
        [
            *before,
            NewEntry(
                EntryKind.MESSAGE,
                {"role": "user", "content": params.content},
                refs,
                entry_id(run_id, "input"),
            ),
            NewEntry(
                EntryKind.RUN_START,
                {"run_id": run_id, "model": model},
                refs,
                entry_id(run_id, "start"),
            ),
        ],
        fresh_ids=True,  # derived from run_id, a new uuid4: nothing to replay
        session_values={"status": "active"},  # the run's
    )
    user_seq = int(appended.entries[len(before)]["seq"])
    run_params = RunParams(
        max_output_tokens=params.max_output_tokens,
        temperature=params.temperature,
        context_policy=params.context_policy,
        metadata=params.metadata,
        on_disconnect=params.on_disconnect,
        fallback_model=(session["config"] or {}).get("fallback_model"),
        run_policy=policy.model_dump(mode="json"),
        tools=params.tools,
        tool_choice=params.tool_choice,
        parallel_tool_calls=params.parallel_tool_calls,
    )
    return await runs.create(
        conn,
        id=run_id,
        tenant_id=tenant_id,
        session_id=session_id,
        kind=RunKind.ASK,
        model=model,
        params=run_params,
        idempotency_key=params.idempotency_key,
        user_entry_seq=user_seq,
        session_marked_active=True,
        claim_for=claim_for,
    )


async def _stop_active_runs(
    engine: AsyncEngine, tenant_id: str, session_id: str, mode: CancelMode
) -> None:
    """Cancel the session's active runs and wait until they have ended (rollback needs their
    last entry before it can append the new user message)."""
    async with engine.begin() as conn:
        for run in await runs_db.active_runs(conn, session_id, kind="ask"):
            locked = await runs_db.get_run(conn, run.id, tenant_id=tenant_id, lock=True)
            if locked is not None and locked.active:
                await runs.request_cancel(conn, locked, mode)
    deadline = time.monotonic() + ROLLBACK_WAIT_SECONDS
    while True:
        async with engine.connect() as conn:
            if not await runs_db.active_runs(conn, session_id, kind="ask"):
                return
        if time.monotonic() > deadline:
            raise Conflict(
                "session_busy", "the running run did not stop in time for a rollback", {}
            )
        await asyncio.sleep(0.05)


async def run_by_idempotency_key(
    engine: AsyncEngine, tenant_id: str, session_id: str, key: str, kind: str = "ask"
) -> Run | None:
    """The run an earlier request with this Idempotency-Key created; 409 when that was a run of
    another kind (an ask's key reused for a compaction, or the reverse)."""
    async with engine.connect() as conn:
        if await sessions_db.get_session(conn, tenant_id, session_id) is None:
            raise session_not_found(session_id)
        run = await runs_db.find_by_idempotency_key(conn, session_id, key)
    if run is not None and run.kind != kind:
        raise Conflict(
            "idempotency_key_reused",
            f"this Idempotency-Key was used for a {run.kind.value} run of this session",
            {"run_id": run.id, "kind": run.kind.value},
        )
    return run
