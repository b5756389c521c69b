"""Asks and cancels: validate, then commit the user's entry, the run and its job at once.

`ask` is the one ask of every surface (native, AI SDK chat, OpenAI Responses): what a surface
needs written with its ask (a session, a rollback, instructions) goes in the same transaction.

Validate → commit → project: a rejected ask (bad input, policy, busy session, context overflow)
writes nothing; an accepted one is committed before any model is called, so a failed call still
leaves the user's words in the journal.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.config import Settings
from app.core import run_policy as run_policies
from app.core.content import content_problems
from app.core.entries import EntryKind, JournalEntry, NewEntry, PendingEntry
from app.core.output_schema import ResponseFormat, schema_problem
from app.core.projection import ProjectionMeta
from app.core.runs import CancelMode, Run, RunParams, entry_id
from app.core.sessions import Session, SessionStatus
from app.core.tool_choice import ToolChoice
from app.db import jobs as jobs_db
from app.db import runs as runs_db
from app.db import sessions as sessions_db
from app.db import steers as steers_db
from app.db.engine import autocommit
from app.llm.router import tool_choice_problem
from app.services import content_checks, quotas
from app.services import reasoning as reasonings
from app.services import run_transitions as runs  # named so until the ask path is rewritten
from app.services.errors import (
    Conflict,
    Invalid,
    ServiceError,
    entries_refused,
    session_not_found,
)
from app.services.handoff import RunHandoff
from app.services.projection import Answer, SessionProjection, project_in, project_session
from app.telemetry import metrics

Strategy = Literal["reject", "enqueue", "interrupt", "rollback", "steer"]
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
    mcp_servers: list[str] = field(default_factory=list)
    mcp_inline: list[dict[str, Any]] = field(default_factory=list)  # RunParams.mcp_inline
    tool_choice: ToolChoice = "auto"  # forced choices hold for the first model turn only
    parallel_tool_calls: bool = True
    reasoning: dict[str, Any] | None = None  # over the session's config.reasoning
    # The JSON Schema the answer follows, and where the surface's request holds its schema
    # (the path a refusal names).
    response_format: ResponseFormat | None = None
    response_format_at: tuple[str, ...] = ("response_format", "json_schema", "schema")
    # Entries committed with the ask, before its user message (a client that sends history
    # along with its question); each gets refs.request_id = the run's id.
    before: tuple[PendingEntry, ...] = ()
    # The run's id, chosen by a caller that records it with the ask (a schedule's firing,
    # written by `prepare`); else a new one.
    run_id: str | None = None


@dataclass(frozen=True)
class AskResult:
    run: Run
    created: bool  # False: an earlier ask with the same Idempotency-Key
    claimed: bool = False  # its job was committed taken by the handoff's worker (ask())
    # multitask_strategy steer: the steer the ask became; `run` is the run it steers.
    steer_id: str | None = None
    # The ask's projection (what its run's first model call is sent), when this ask made one.
    context: ProjectionMeta | None = None
    # Its run's first event (run.created) as followers read it, when this ask created the run.
    first_event: dict[str, Any] | None = None
    # When this ask created the run: the session as the ask read it (its config is the run's),
    # and the run's entries as committed (its user entry and run_start).
    session: Session | None = None
    entries: tuple[JournalEntry, ...] = ()
    # The thread's newest entries as the ask read them, its own appended (up to the rev it
    # left the session at), when it read them unlocked: what its run's first step projects.
    newest: sessions_db.Newest | None = None
    # Its run, started by the ask's commit (its job taken by the handoff's worker), and what
    # its start would have read of the session: the handoff executes it as it is.
    started: runs_db.FirstStart | None = None


# What a surface writes with its ask, in the ask's transaction and before the ask's own rows:
# the session it makes for the ask, a rollback, new instructions. The ask is validated against
# what it wrote; a refusal (raised here or later) rolls all of it back: nothing to undo.
Prepare = Callable[[AsyncConnection], Awaitable[None]]


async def ask_uncounted(
    engine: AsyncEngine,
    settings: Settings,
    tenant_id: str,
    session_id: str,
    params: AskParams,
    own_limits: quotas.Limits | None = None,
    handoff: RunHandoff | None = None,
    prepare: Prepare | None = None,
    followed: bool = False,
) -> AskResult:
    """The one ask of every surface: validate, commit (`prepare`'s writes, the user entry, the
    run and its job) in one transaction, then hand the run to this process's workers.

    `own_limits`: the tenant's own limits when the caller read them already (with the
    request's key); else the quota check reads them. `handoff`: this process's workers
    (`threadline serve`): with room, the job is committed taken by one of them and the run
    started at once; else it waits for the queue. `prepare`: see Prepare; the session it
    makes, if any, is `session_id`. `followed`: the caller streams the run from its start (in
    this process): if this process's workers take it, what they publish before the stream
    subscribes is kept for it (its replay reads nothing)."""
    if params.idempotency_key:
        key = params.idempotency_key
        answered = await earlier_ask(engine, tenant_id, session_id, key)
        if answered is not None:
            return answered
    # Validation, before anything is written: the content suits every provider, the policy
    # resolves, and the ask fits.
    # The size first: it is read from the base64's length, the rest decodes it.
    content_checks.check_sizes(
        settings,
        [
            (("input",), params.content),
            *(
                (("before", i, "payload", "content"), e.payload.get("content"))
                for i, e in enumerate(params.before)
            ),
        ],
    )
    refused = [p.as_error("input") for p in content_problems("user", params.content)]
    if refused:
        raise entries_refused(refused)
    if params.response_format is not None:
        _check_schema(params.response_format, params.response_format_at)
    model: str | None = None
    if params.multitask_strategy == "rollback" and prepare is None:
        # Projected before anything is stopped: a refused ask leaves the running run alone.
        # Any other ask is projected in its commit, from the session row it locks there.
        checked = await project_session(
            engine,
            settings,
            tenant_id,
            session_id,
            pending=_pending(params),
            policy=params.context_policy,
            model=params.model,
            extra_tools=params.tools,
            answer=Answer(params.reasoning, params.max_output_tokens),
        )
        model = _served(checked, params)
    if params.multitask_strategy == "rollback":
        # Before stopping anything: a refused ask leaves the running run alone.
        await check_quotas(
            engine, settings, tenant_id, replacing_runs_of=session_id, own_limits=own_limits
        )
        await _stop_active_runs(engine, tenant_id, session_id, "rollback")
    claim_for = handoff.reserve() if handoff is not None else None
    lease = handoff.lease if handoff is not None and claim_for is not None else None

    async def commit(claim: int | None) -> AskResult:
        if prepare is None and model is None:  # a rollback projected (and stopped) already
            unlocked = await _commit_unlocked(
                engine, settings, tenant_id, session_id, params, own_limits, claim, lease
            )
            if unlocked is not None:
                return unlocked
        async with engine.begin() as conn:
            if prepare is not None:
                await prepare(conn)
            # Locked first: nothing is appended under the projection, nor before the commit.
            session = await sessions_db.get_session(conn, tenant_id, session_id, lock=True)
            if session is None:
                raise session_not_found(session_id)
            resolved, context = model, None
            if resolved is None:
                checked, _ = await _checked_in(conn, settings, session, params)
                resolved, context = _served(checked, params), checked.projection.meta
            queued = await _commit(conn, settings, session, params, resolved, own_limits, claim)
        assert queued is not None  # written on no condition
        return _result(queued, context, session)

    async def committed() -> AskResult:
        try:
            result = await _committing(engine, tenant_id, session_id, params, commit, claim_for)
        finally:
            if handoff is not None and claim_for is not None:
                handoff.release()
        if result.created and result.steer_id is None and handoff is not None:
            first = result.first_event if followed else None
            handoff.offer(
                result.run.id,
                result.run.job_id,
                claimed=result.claimed,
                followed=first,
                newest=result.newest,
                started=result.started,
            )
        return result

    # Shielded when the job may be committed taken: a request cancelled after the commit
    # still hands its run over (no one else would start it while this process lives).
    return await (asyncio.shield(committed()) if claim_for is not None else committed())


# The one ask of every surface, counted in the asks metric by outcome. ask_uncounted is for a
# caller that counts its own (the AI SDK chat, which tries the chat's sessions in turn).
ask = metrics.counted_ask(refusals=ServiceError)(ask_uncounted)


def _result(
    queued: runs_db.QueuedRun | Steered, context: ProjectionMeta | None, session: Session
) -> AskResult:
    if isinstance(queued, Steered):
        return AskResult(queued.run, True, steer_id=queued.steer_id)
    return AskResult(
        queued.run,
        True,
        queued.claimed,
        context=context,
        first_event=queued.created,
        session=session,
        entries=queued.entries,
    )


async def _commit_unlocked(
    engine: AsyncEngine,
    settings: Settings,
    tenant_id: str,
    session_id: str,
    params: AskParams,
    own_limits: quotas.Limits | None,
    claim_for: int | None,
    start_under: int | None,
) -> AskResult | None:
    """The ask of an idle session committed without locking its row first: read, then one
    statement that writes only if the row is still the one read (two round trips rather than
    four). Every write that bears on an idle session's ask writes the session's row (an
    append, a run's creation or end, a change of its config), so an unchanged row means
    nothing the ask read has changed. None: the ask needs the row locked (a run under way,
    limits that count, entries that need the append's checks), or the row changed meanwhile;
    nothing is written then, and the caller commits the ask under the row's lock.
    `start_under`: the lease of the worker `claim_for` names: a run whose job that statement
    takes is started by it too (AskResult.started)."""
    async with autocommit(engine) as conn:
        found = await sessions_db.get_session_as_read(conn, tenant_id, session_id)
        if found is None:
            raise session_not_found(session_id)
        session, version = found.session, found.version
        policy = run_policies.merged(session.config.run_policy, params.run_policy)
        if (
            session.status is not SessionStatus.IDLE
            or policy.max_turns is not None
            or quotas.ask_locks_tenant(settings, own_limits)
        ):
            return None
        checked, tail = await _checked_in(conn, settings, session, params, found.newest)
        resolved, context = _served(checked, params), checked.projection.meta
        queued = await _commit(
            conn,
            settings,
            session,
            params,
            resolved,
            own_limits,
            claim_for,
            unchanged=version,
            start_under=start_under,
        )
        await conn.commit()  # behind a transaction pooler, autocommit is not set
    if queued is None:
        return None
    assert not isinstance(queued, Steered)  # an idle session has no run to steer
    result = _result(queued, context, session)
    newest = None
    if not params.before:  # (else its entries are more than its run's)
        # Nothing was appended between its read and its commit (the row was as read): its own
        # entries follow the tail it read.
        newest = sessions_db.Newest.of([*tail.entries, *queued.entries], tail.reaches_start)
    return replace(result, newest=newest, started=_started(queued, session, newest))


def _started(
    queued: runs_db.QueuedRun, session: Session, newest: sessions_db.Newest | None
) -> runs_db.FirstStart | None:
    """The start of its run an ask's statement wrote (runs_db.insert_asked_run), with what the
    run's own start would have read of its session (runs_db.start_first): `session` as the ask
    read it, as that statement left its row; `newest`, the thread's newest entries then."""
    started = queued.started
    if started is None:
        return None
    after = replace(
        session,
        rev=started.rev,
        status=SessionStatus.ACTIVE,
        title=started.title,
        updated_at=started.updated_at,
    )
    written = list(queued.entries)  # what the run has written: its ask's entries, as committed
    start = sessions_db.RunStart(after, started.compacting, written, newest, started.version)
    # No steer can be pending for a run that statement made.
    return runs_db.FirstStart(queued.run, started.event_seq, False, start)


async def _committing(
    engine: AsyncEngine,
    tenant_id: str,
    session_id: str,
    params: AskParams,
    commit: Callable[[int | None], Awaitable[AskResult]],
    claim_for: int | None,
) -> AskResult:
    """`commit`, taken by `claim_for` if it can be; the run of a concurrent ask with the same
    Idempotency-Key if that one won."""
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
        unique = ("runs_idempotency_key", "steers_idempotency_key")
        if not any(name in str(exc.orig) for name in unique) or not params.idempotency_key:
            raise
    answered = await earlier_ask(engine, tenant_id, session_id, params.idempotency_key)
    assert answered is not None
    return answered


def _check_schema(format: ResponseFormat, at: tuple[str, ...]) -> None:
    """422 invalid_output_schema naming (a JSON pointer into the request) the first thing that
    makes the format's schema unfit for strict structured output."""
    problem = schema_problem(format.schema_)
    if problem is None:
        return
    location = "".join(f"/{p}" for p in at) + problem.pointer
    raise Invalid(
        "invalid_output_schema",
        f"the schema cannot be used for structured output: {problem.message} (at {location})",
        {"location": location, "loc": ["body", *at]},
    )


def _pending(params: AskParams) -> list[PendingEntry]:
    return [*params.before, PendingEntry("message", {"role": "user", "content": params.content})]


def _served(checked: SessionProjection, params: AskParams) -> str:
    """The model the ask runs on, once its tool choice is known to be one it can serve and
    its context what it can read (the ask's input was checked by the projection)."""
    for at, message in enumerate(checked.projection.messages):
        content_checks.check_readable(checked.model, message.content, ["context", at, "content"])
    offered = [t.name for t in checked.projection.tool_spec]
    unserved = tool_choice_problem(checked.model, params.tool_choice, offered)
    if unserved is not None:
        details = {"loc": ["body", "tool_choice"], "model": checked.model, "tools": offered}
        raise Invalid("invalid_tool_choice", unserved, details)
    return checked.model


async def _checked_in(
    conn: AsyncConnection,
    settings: Settings,
    session: Session,
    params: AskParams,
    newest: sessions_db.Newest | None = None,
) -> tuple[SessionProjection, sessions_db.Newest]:
    """The ask projected in its own transaction, against the session row it locked there (and
    what its surface wrote before); or against the session it read unlocked, with the thread's
    newest entries read with it (`newest`: what more it needs is read on `conn`)."""
    return await project_in(
        conn,
        settings,
        session,
        pending=_pending(params),
        policy=params.context_policy,
        model=params.model,
        extra_tools=params.tools,
        answer=Answer(params.reasoning, params.max_output_tokens),
        newest=newest,
    )


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
            len(await runs_db.active_runs(conn, replacing_runs_of, kind="ask", tenant_id=tenant_id))
            if replacing_runs_of is not None
            else 0
        )
        await quotas.check_ask(conn, settings, tenant_id, replacing=replacing, own=own_limits)


@dataclass(frozen=True)
class Steered:
    """An ask that became a steer of the session's running run."""

    run: Run
    steer_id: str


async def _commit(
    conn: AsyncConnection,
    settings: Settings,
    session: Session,
    params: AskParams,
    model: str,
    own_limits: quotas.Limits | None,
    claim_for: int | None,
    unchanged: int | None = None,
    start_under: int | None = None,
) -> runs_db.QueuedRun | Steered | None:
    """The user entry, run_start, the run, run.created and the job, in the transaction that
    locked `session`; or, for a steer of a running run, the steer. `unchanged`: `session` is
    not locked but was read at this version of its row (_commit_unlocked): the commit is one
    statement, written only if the row is still that version; None if it was not.
    `start_under`: run_transitions.create_asked's."""
    tenant_id, session_id = session.tenant_id, session.id
    policy = run_policies.merged(session.config.run_policy, params.run_policy)
    # Counting the session's turns is a query: only made when a turn limit is set.
    turns = await runs_db.count_asks(conn, session_id) if policy.max_turns is not None else 0
    refused = run_policies.violation_before_ask(policy, turns, session.tokens_used)
    if refused is not None:
        rule, message = refused
        raise Conflict("policy_violation", message, {"rule": rule})
    where = ["body", "reasoning"] if params.reasoning is not None else ["config", "reasoning"]
    reasoning = reasonings.check(
        settings,
        model,
        session.config.reasoning,
        params.reasoning,
        where,
        params.tool_choice,
    )
    config = session.config
    # The ask's own, else the session's (its config), else the provider decides.
    temperature = config.temperature if params.temperature is None else params.temperature
    run_params = RunParams(
        max_output_tokens=params.max_output_tokens or config.max_output_tokens,
        temperature=temperature,
        context_policy=params.context_policy,
        metadata=params.metadata,
        on_disconnect=params.on_disconnect,
        fallback_model=config.fallback_model,
        run_policy=policy.model_dump(mode="json"),
        tools=params.tools,
        mcp_servers=params.mcp_servers,
        mcp_inline=params.mcp_inline,
        tool_choice=params.tool_choice,
        parallel_tool_calls=params.parallel_tool_calls,
        reasoning=reasoning.model_dump(exclude_none=True) if reasoning else None,
        response_format=params.response_format.as_json() if params.response_format else None,
    )
    # A compaction in flight is no reason to refuse: the ask's job queues behind it. An idle
    # session has no run under way (a run's creation marks it active, and its end marks it
    # idle unless another run is active, each under this locked row): nothing to read.
    active = (
        await runs_db.active_runs(conn, session_id, kind="ask", tenant_id=tenant_id)
        if session.status is not SessionStatus.IDLE
        else []
    )
    if params.multitask_strategy == "steer":
        steered = await _steer(conn, tenant_id, active, params, model, run_params)
        if steered is not None:
            return steered
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
    run_id = params.run_id or str(uuid.uuid4())
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
    return await runs.create_asked(
        conn,
        entries=[
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
        input_at=len(before),
        id=run_id,
        tenant_id=tenant_id,
        session_id=session_id,
        model=model,
        params=run_params,
        idempotency_key=params.idempotency_key,
        claim_for=claim_for,
        unchanged=unchanged,
        start_under=start_under,
    )


async def _steer(
    conn: AsyncConnection,
    tenant_id: str,
    active: list[Run],
    params: AskParams,
    model: str,
    run_params: RunParams,
) -> Steered | None:
    """The ask as a steer of the session's running run (the oldest active one not being
    cancelled), committed now and journaled at the run's next model turn; None when no run is
    there to steer (the ask then starts its own). The run's row is locked: a run that ends
    meanwhile ends after this commit, and its end then finds the steer (run_transitions)."""
    for candidate in active:
        run = await runs_db.get_run(conn, candidate.id, tenant_id=tenant_id, lock=True)
        if run is None or not run.active or run.cancel_mode:
            continue
        steer_id = str(uuid.uuid4())
        steer = steers_db.Steer(
            steer_id,
            tenant_id,
            run.session_id,
            run.id,
            params.content,
            model,
            run_params.ask_json(),
            params.idempotency_key,
        )
        await steers_db.insert_steer(conn, steer)
        return Steered(run, steer_id)
    return None


async def _stop_active_runs(
    engine: AsyncEngine, tenant_id: str, session_id: str, mode: CancelMode
) -> None:
    """Cancel the session's active runs and wait until they have ended (rollback needs their
    last entry before it can append the new user message)."""
    async with engine.begin() as conn:
        for run in await runs_db.active_runs(conn, session_id, kind="ask", tenant_id=tenant_id):
            locked = await runs_db.get_run(conn, run.id, tenant_id=tenant_id, lock=True)
            if locked is not None and locked.active:
                await runs.request_cancel(conn, locked, mode)
    deadline = time.monotonic() + ROLLBACK_WAIT_SECONDS
    while True:
        async with engine.connect() as conn:
            if not await runs_db.active_runs(conn, session_id, kind="ask", tenant_id=tenant_id):
                return
        if time.monotonic() > deadline:
            raise Conflict(
                "session_busy", "the running run did not stop in time for a rollback", {}
            )
        await asyncio.sleep(0.05)


async def earlier_ask(
    engine: AsyncEngine, tenant_id: str, session_id: str, key: str
) -> AskResult | None:
    """What an earlier ask with this Idempotency-Key became: its run, or the steer (with the
    run it steers); one connection for both lookups."""
    async with engine.connect() as conn:
        run = await _run_by_key(conn, tenant_id, session_id, key, "ask")
        if run is not None:
            return AskResult(run, created=False)
        steer = await steers_db.find_by_idempotency_key(conn, session_id, key)
        if steer is None or steer.tenant_id != tenant_id:
            return None
        steered = await runs_db.get_run(conn, steer.run_id, tenant_id=tenant_id)
    return None if steered is None else AskResult(steered, created=False, steer_id=steer.id)


async def run_by_idempotency_key(
    engine: AsyncEngine, tenant_id: str, session_id: str, key: str, kind: str = "ask"
) -> Run | None:
    """The run an earlier request with this Idempotency-Key created; 409 when that was a run of
    another kind (an ask's key reused for a compaction, or the reverse)."""
    async with engine.connect() as conn:
        return await _run_by_key(conn, tenant_id, session_id, key, kind)


async def _run_by_key(
    conn: AsyncConnection, tenant_id: str, session_id: str, key: str, kind: str
) -> Run | None:
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
