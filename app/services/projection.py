"""Projection use cases: what an ask would send the model now, and how full the context is."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from sqlalchemy import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.config import Settings
from app.core import policy as policies
from app.core import reasoning as reasonings
from app.core import run_policy as run_policies
from app.core.builtin_tools import with_builtin_schema
from app.core.compaction import nothing_to_compact, plan_compaction, reaches_checkpoint
from app.core.entries import EntryKind, JournalEntry, PayloadError, PendingEntry, normalize_entry
from app.core.lineage import Segment
from app.core.memory import MEMORY_TOOLS
from app.core.messages import ToolSpec
from app.core.projection import ContextOverflow, Projection, ProjectionInput, project, tail_suffices
from app.core.runs import Run, RunKind
from app.core.sessions import Session, SessionConfig
from app.core.tokens import STORED_ENCODING
from app.db import journal as journal_db
from app.db import sessions as sessions_db
from app.db.engine import read_snapshot
from app.db.memory import get_memory
from app.db.sessions import Newest
from app.llm.catalog import context_window_for, reasoning_sent_back
from app.llm.tokenizers import counting_for
from app.services.content_checks import check_readable
from app.services.errors import Invalid, entries_refused, session_not_found


@dataclass(frozen=True)
class SessionProjection:
    model: str
    context_window: int
    policy: policies.ContextPolicy
    projection: Projection


RECENT_COMPACTIONS = 20  # listed by GET /context


@dataclass(frozen=True)
class SessionContext:
    projected: SessionProjection
    summaries: int  # summary checkpoints (compactions) in the whole thread
    recent_summaries: list[RowMapping]  # the newest of them, newest first
    nothing_to_compact: str | None  # why a compaction now would find nothing, else None


@dataclass(frozen=True)
class _Projected:
    projected: SessionProjection
    thread: list[Segment]
    tail: list[JournalEntry]  # the entries read for it, ascending
    complete: bool  # the tail reaches the thread's start


async def project_session(
    engine: AsyncEngine,
    settings: Settings,
    tenant_id: str,
    session_id: str,
    *,
    pending: Sequence[PendingEntry] = (),
    policy: Mapping[str, Any] | None = None,
    model: str | None = None,
    run_id: str | None = None,
    extra_tools: Sequence[Mapping[str, Any]] = (),
    include_expired: bool = False,
    answer: Answer | None = None,
    run_policy: Mapping[str, Any] | None = None,
) -> SessionProjection:
    """Exactly what an ask would send now; reads only the tail the budget can use, writes
    nothing. Raises Invalid (context_overflow, invalid_policy, invalid_entries, invalid_content)
    when there is no valid answer."""
    pending = canonical_pending(pending)
    async with read_snapshot(engine) as conn:
        session = await sessions_db.get_session(
            conn, tenant_id, session_id, include_expired=include_expired
        )
        if session is None:
            raise session_not_found(session_id)
        done = await _project(
            conn, settings, session, pending, policy, model, run_id, extra_tools, answer, run_policy
        )
        return done.projected


async def project_in(
    conn: AsyncConnection,
    settings: Settings,
    session: Session,
    *,
    pending: Sequence[PendingEntry] = (),
    policy: Mapping[str, Any] | None = None,
    model: str | None = None,
    extra_tools: Sequence[Mapping[str, Any]] = (),
    answer: Answer | None = None,
    newest: Newest | None = None,
) -> tuple[SessionProjection, Newest]:
    """project_session in the caller's transaction, from the session it read (locked)
    there: an ask that writes before it projects (a rollback, a new session) sees its writes.
    `newest`: the thread's newest entries, read with the session: the thread is read on
    `conn` only if the projection needs older ones. With the projection, the thread's newest
    entries it was made from (up to the session's rev)."""
    pending = canonical_pending(pending)
    try:
        done = await _project(
            conn, settings, session, pending, policy, model, None, extra_tools, answer, None, newest
        )
    except _ReadsFurther:
        done = await _project(
            conn, settings, session, pending, policy, model, None, extra_tools, answer
        )
    return done.projected, Newest.of(done.tail, done.complete)


def canonical_pending(pending: Sequence[PendingEntry]) -> list[PendingEntry]:
    """Pending entries as an append would store them (validated, defaults filled, unset
    optionals left out), so that they project as they will once committed."""
    errors: list[dict[str, Any]] = []
    canonical: list[PendingEntry] = []
    for index, entry in enumerate(pending):
        try:
            payload, refs = normalize_entry(EntryKind(entry.kind), entry.payload, entry.refs)
        except PayloadError as exc:
            errors += [{**e, "loc": ["pending", index, *e["loc"]]} for e in exc.errors]
            continue
        canonical.append(PendingEntry(entry.kind, payload, refs))
    if errors:
        raise entries_refused(errors)
    return canonical


async def project_for_run(engine: AsyncEngine, settings: Settings, run: Run) -> SessionProjection:
    """What an ask run's next model call gets (its model, policy overrides and tools); for a
    compaction run, what the session's next ask would get."""
    ask = run.kind is RunKind.ASK
    return await project_session(
        engine,
        settings,
        run.tenant_id,
        run.session_id,
        policy=run.params.context_policy if ask else None,
        model=run.model if ask else None,
        run_id=run.id if ask else None,
        extra_tools=run.params.tools if ask else [],
        include_expired=True,  # a run under way finishes
        answer=Answer.of_run(run) if ask else None,
        run_policy=run.params.run_policy if ask else None,
    )


async def project_run_in(
    conn: AsyncConnection, settings: Settings, session: Session, run: Run
) -> SessionProjection:
    """project_for_run in the caller's snapshot (read_snapshot), from the session it read
    there: a worker starting a run reads the session once for its own needs and this."""
    return (await _project_run(conn, settings, session, run)).projected


async def project_run_from(
    settings: Settings, session: Session, run: Run, newest: Newest
) -> SessionProjection | None:
    """project_run_in from the thread's newest entries read with the session (read_for_run:
    one statement, one snapshot), reading nothing more; None when they do not reach back far
    enough, or the session reads memory (the caller projects in a snapshot then)."""
    if session.config.memory_namespace:
        return None
    try:
        return (await _project_run(None, settings, session, run, newest)).projected
    except _ReadsFurther:
        return None


async def _project_run(
    conn: AsyncConnection | None,
    settings: Settings,
    session: Session,
    run: Run,
    newest: Newest | None = None,
) -> _Projected:
    ask = run.kind is RunKind.ASK
    return await _project(
        conn,
        settings,
        session,
        (),
        run.params.context_policy if ask else None,
        run.model if ask else None,
        run.id if ask else None,
        run.params.tools if ask else [],
        Answer.of_run(run) if ask else None,
        run.params.run_policy if ask else None,
        newest=newest,
    )


class _ReadsFurther(Exception):
    """The newest entries given do not reach back as far as the projection needs."""


async def session_context(
    engine: AsyncEngine, settings: Settings, tenant_id: str, session_id: str
) -> SessionContext:
    """How full the context of the next ask would be, and how often it was compacted."""
    async with read_snapshot(engine) as conn:
        session = await sessions_db.get_session(conn, tenant_id, session_id)
        if session is None:
            raise session_not_found(session_id)
        done = await _project(conn, settings, session, (), None, None, None, ())
        thread = done.thread
        # The tail read for the projection answers it when it reaches the latest checkpoint
        # (or the start); when it stopped short at the budget, what it left out is older
        # history a compaction would summarize.
        keep = done.projected.policy.keep_last_turns
        refused = None
        exact = done.complete or reaches_checkpoint(done.tail)
        if exact and plan_compaction(done.tail, keep) is None:
            refused = nothing_to_compact(keep)
        return SessionContext(
            done.projected,
            await journal_db.count_kind(conn, thread, "summary"),
            await journal_db.read_entries(
                conn, thread, kinds=["summary"], descending=True, limit=RECENT_COMPACTIONS
            ),
            refused,
        )


@dataclass(frozen=True)
class Answer:
    """What an ask asks of the answer that the projection must leave room for: its reasoning
    (over the session's) and its cap."""

    reasoning: Mapping[str, Any] | None = None  # the ask's; None: the session's
    max_output_tokens: int | None = None

    @classmethod
    def of_run(cls, run: Run) -> Answer:
        # A run's reasoning is already the effective one: None there means off.
        return cls(run.params.reasoning or {"effort": "none"}, run.params.max_output_tokens)


async def _project(
    conn: AsyncConnection | None,
    settings: Settings,
    session: Session,
    pending: Sequence[PendingEntry],
    overrides: Mapping[str, Any] | None,
    model_override: str | None,
    run_id: str | None,
    extra_tools: Sequence[Mapping[str, Any]],
    answer: Answer | None = None,
    run_policy: Mapping[str, Any] | None = None,
    newest: Newest | None = None,
) -> _Projected:
    """`run_policy`: the run's resolved one (else the session's), whose `never` tools are not
    offered. `newest`: the thread's newest entries, read already (then `conn` may be None:
    _ReadsFurther when they do not suffice)."""
    config = session.config
    model = model_override or config.model or settings.default_model
    # What the model cannot read is refused before what it cannot fit: the clearer reason.
    for entry in pending:
        if entry.kind == "message":
            check_readable(model, entry.payload.get("content", ""), ["body", "input"])
    window = await context_window_for(settings, model)
    policy = resolve_policy(window, settings.context_policy, config.context_policy, overrides)
    policy = _with_room_to_think(policy, model, config.reasoning, answer or Answer())
    counting = counting_for(model, policy.token_estimator)
    recount = counting.counter.name != STORED_ENCODING
    thread = session.thread

    def suffices(tail: list[JournalEntry]) -> bool:
        return tail_suffices(tail, policy, recount)

    if newest is not None:
        found = await journal_db.tail_from(newest, suffices)
        if found is None:
            raise _ReadsFurther
        tail, complete = found
    else:
        assert conn is not None
        tail, complete = await journal_db.read_tail(conn, thread, suffices)
    # Read in the same snapshot as the journal; memory outlives sessions and compaction, so it
    # is looked up by name on every projection rather than carried in the thread.
    namespace = config.memory_namespace
    memory = None
    if namespace:
        assert conn is not None  # project_run_from leaves sessions with memory to the snapshot
        memory = await get_memory(conn, session.tenant_id, namespace)
    source = ProjectionInput(
        entries=tail,
        complete=complete,
        rev=session.rev,
        policy=policy,
        counter=counting.counter,
        exact=counting.exact,
        pending=pending,
        system_prompt=config.system_prompt,
        memory=memory["content"] if memory is not None else None,
        memory_namespace=namespace,
        tools=tool_specs(_allowed(offered_tools(config, extra_tools), run_policy, config)),
        run_id=run_id,
        reasoning_sent=reasoning_sent_back(settings, model),
    )
    try:
        projection = project(source)
    except ContextOverflow as exc:
        raise Invalid("context_overflow", str(exc), {**exc.details, "model": model}) from exc
    return _Projected(SessionProjection(model, window, policy, projection), thread, tail, complete)


def _with_room_to_think(
    policy: policies.ContextPolicy,
    model: str,
    session_reasoning: Mapping[str, Any] | None,
    answer: Answer,
) -> policies.ContextPolicy:
    """The policy keeping room for the answer's thinking and its text (the thinking budget
    and the answer's cap) when that is more than its reserve: a large thinking budget fits."""
    try:
        thinking = reasonings.effective(session_reasoning, answer.reasoning)
    except ValidationError:
        return policy  # not a valid setting: refused where reasoning is checked
    room = reasonings.output_room(thinking, answer.max_output_tokens)
    if room <= policy.reserve:
        return policy
    if room >= policy.max_input_tokens:
        raise Invalid(
            "context_overflow",
            f"the thinking budget and the answer's cap ({room} tokens) leave no room for the "
            f"prompt in {model}'s {policy.max_input_tokens} tokens: lower the reasoning budget "
            "or max_output_tokens",
            {"model": model, "output_room": room, "max_input_tokens": policy.max_input_tokens},
        )
    return policy.model_copy(update={"reserve_output_tokens": room})


def resolve_policy(window: int, *layers: Mapping[str, Any] | None) -> policies.ContextPolicy:
    """Server default for the model < server config < session < request."""
    try:
        return policies.resolve(policies.for_model(window), *layers)
    except ValidationError as exc:
        errors = [
            {"loc": ["context_policy", *e["loc"]], "msg": e["msg"], "type": e["type"]}
            for e in exc.errors()
        ]
        field = ".".join(str(p) for p in errors[0]["loc"]) if errors else "context_policy"
        raise Invalid(
            "invalid_policy",
            f"the resolved context policy is invalid at {field}",
            {"errors": errors},
        ) from exc


def merge_tools(
    session_tools: Sequence[Mapping[str, Any]], ask_tools: Sequence[Mapping[str, Any]]
) -> list[Mapping[str, Any]]:
    """The tools a run offers: the session's, with an ask's own added or replacing by name."""
    by_name = {t["name"]: t for t in session_tools}
    by_name.update({t["name"]: t for t in ask_tools})
    return list(by_name.values())


def offered_tools(
    config: SessionConfig, ask_tools: Sequence[Mapping[str, Any]]
) -> list[Mapping[str, Any]]:
    """The tools a run offers: the memory built-ins when the session names a memory_namespace,
    then the session's, then the ask's (a later definition of the same name wins); built-ins
    with their full schemas, however they were declared."""
    session_tools: list[Mapping[str, Any]] = list(config.tools or [])
    if config.memory_namespace:
        session_tools = [*MEMORY_TOOLS, *session_tools]
    return [with_builtin_schema(t) for t in merge_tools(session_tools, ask_tools)]


def _allowed(
    tools: Sequence[Mapping[str, Any]],
    run_policy: Mapping[str, Any] | None,
    config: SessionConfig,
) -> list[Mapping[str, Any]]:
    """The tools whose approval rule is not `never`: those the model is not offered."""
    rules = run_policies.merged(run_policy if run_policy is not None else config.run_policy)
    return [t for t in tools if rules.approval_rule(str(t["name"])) != "never"]


def tool_specs(tools: Sequence[Mapping[str, Any]]) -> tuple[ToolSpec, ...]:
    return tuple(
        ToolSpec(
            t["name"],
            t.get("description", ""),
            t.get("parameters") or {"type": "object", "properties": {}},
        )
        for t in tools
    )
