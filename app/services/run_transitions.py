"""A run's transitions applied to the database, each inside the caller's transaction: the
row, the journal entries the transition commits, the session's status and totals, and the
events it emits, together or not at all.

Used by the services (an ask, a cancel, tool outputs) and by the worker (start, wait for
tools, end). Entry ids derive from the run id; a run is ended only while it is active, under
its row's lock, so a worker that died after committing its end never writes it twice (the
unique index of entry ids backs that up).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from sqlalchemy import RowMapping, func, update
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core.entries import EntryKind, JournalEntry, NewEntry
from app.core.messages import text_of
from app.core.runs import WAITING, CancelMode, Outcome, Run, RunKind, RunParams, RunStatus, entry_id
from app.db import approvals as approvals_db
from app.db import jobs as jobs_db
from app.db import journal as journal_db
from app.db import runs as runs_db
from app.db import steers as steers_db
from app.db import tenants as tenants_db
from app.db import webhooks as webhooks_db
from app.db.sessions import RunEnded
from app.db.tables import sessions
from app.eventlog import store as event_store
from app.eventlog import writer
from app.eventlog.registry import TERMINAL_BY_STATUS, Event, EventType
from app.llm.catalog import cost_usd, model_labels
from app.runs import machine
from app.services import webhooks
from app.services.journal import append_in, fresh_append, fresh_rows, untitled_title
from app.telemetry import carried, metrics

# A run whose workers died this many times while running it fails instead of being passed on.
MAX_WORKERS_LOST = 2
# The statements that append entries with more (an ask's, with its run; a run's end), timed
# as journal appends.
_insert_asked_run = metrics.timed_append(runs_db.insert_asked_run)
_end_run_appending = metrics.timed_append(runs_db.end_run)


async def create(
    conn: AsyncConnection,
    *,
    id: str,
    tenant_id: str,
    session_id: str,
    kind: RunKind,
    model: str,
    params: RunParams,
    idempotency_key: str | None,
    user_entry_seq: int | None = None,
    session_marked_active: bool = False,
    claim_for: int | None = None,
) -> runs_db.QueuedRun:
    """Insert a queued run, announce it with `run.created` and defer its job: the run and its
    job are committed together or not at all. `session_marked_active`: the caller has set the
    session's status (with its append), else it is set here. `claim_for`: this process's
    worker id, to take the job at once if its session allows (runs_db.insert_queued_run)."""
    params = carried.into(params, run_id=id, tenant_id=tenant_id, session_id=session_id)
    created = machine.created_event(id, session_id, kind, user_entry_seq, model)
    queued = await runs_db.insert_queued_run(
        conn,
        event_store.run_event(*created),
        id=id,
        tenant_id=tenant_id,
        session_id=session_id,
        kind=kind.value,
        model=model,
        params=params.ask_json() if kind is RunKind.ASK else params.compaction_json(),
        idempotency_key=idempotency_key,
        user_entry_seq=user_entry_seq,
        claim_for=claim_for,
    )
    metrics.run_created(kind.value)
    if not session_marked_active:
        await conn.execute(
            update(sessions)
            .where(sessions.c.id == session_id)
            .values(status="active", updated_at=func.now())
        )
    return replace(queued, created=_first_event(id, created))


def _first_event(run_id: str, created: Event) -> dict[str, Any]:
    """A new run's run.created as its followers read it: its first event, seq 1."""
    (first,) = event_store.numbered([(run_id, *created)], {run_id: 1})
    return first


async def create_asked(
    conn: AsyncConnection,
    *,
    entries: Sequence[NewEntry],
    input_at: int,
    id: str,
    tenant_id: str,
    session_id: str,
    model: str,
    params: RunParams,
    idempotency_key: str | None,
    claim_for: int | None = None,
    unchanged: int | None = None,
    start_under: int | None = None,
) -> runs_db.QueuedRun | None:
    """An ask's entries (its user entry at `input_at`; fresh ids, derived from the run's id)
    and its run (as `create`), in the transaction that locked its session: in one statement
    (runs_db.insert_asked_run); entries that need append_in's checks are appended first.
    `unchanged`: the session is not locked, but was read at this version of its row: one
    statement written only if the row is still that version, or nothing (None answers: the
    caller locks the row and asks again). `start_under`: the lease of the worker `claim_for`
    names, which the run is then started under if its job is taken (QueuedRun.started): the
    caller must execute it (runs_db.insert_asked_run)."""
    rows = fresh_rows(entries)
    if rows is None and unchanged is not None:
        return None
    if rows is None:
        appended = await append_in(
            conn,
            tenant_id,
            session_id,
            entries,
            fresh_ids=True,
            session_values={"status": "active"},  # the run's
        )
        made = await create(
            conn,
            id=id,
            tenant_id=tenant_id,
            session_id=session_id,
            kind=RunKind.ASK,
            model=model,
            params=params,
            idempotency_key=idempotency_key,
            user_entry_seq=int(appended.entries[input_at]["seq"]),
            session_marked_active=True,
            claim_for=claim_for,
        )
        return replace(made, entries=_asked_entries(appended.entries[input_at:]))
    params = carried.into(params, run_id=id, tenant_id=tenant_id, session_id=session_id)
    created = machine.created_event(id, session_id, RunKind.ASK, None, model)
    ((started_kind, started_data),) = machine.first_start().events
    queued = await _insert_asked_run(
        conn,
        event_store.run_event(*created, from_run=("user_entry_seq",)),
        event_store.run_started(started_kind, started_data),
        rows,
        input_at,
        untitled_title(rows),
        id=id,
        tenant_id=tenant_id,
        session_id=session_id,
        model=model,
        params=params.ask_json(),
        idempotency_key=idempotency_key,
        claim_for=claim_for,
        unchanged=unchanged,
        start_under=start_under,
    )
    if queued is None:
        return None
    metrics.run_created(RunKind.ASK.value)
    input_seq = queued.run.user_entry_seq
    stored = machine.created_event(id, session_id, RunKind.ASK, input_seq, model)
    assert input_seq is not None
    asked = [{**row, "seq": input_seq + i} for i, row in enumerate(rows[input_at:])]
    return replace(queued, created=_first_event(id, stored), entries=_asked_entries(asked))


def _asked_entries(rows: Sequence[RowMapping | Mapping[str, Any]]) -> tuple[JournalEntry, ...]:
    """An ask's run's entries (its user entry and run_start), as committed at their seqs (and
    as they read back: jsonb's key order)."""
    return tuple(
        journal_db.journal_entry(
            {
                **r,
                "payload": event_store.as_jsonb(r["payload"]),
                "refs": event_store.as_jsonb(r["refs"]),
            }
        )
        for r in rows
    )


async def start(conn: AsyncConnection, run: Run, lease: int) -> Run:
    """A worker holding `lease` takes the run (locked by the caller, active, not being
    cancelled). A run whose workers died too often while running it fails instead: whatever
    it does takes its worker down."""
    if run.status is RunStatus.RUNNING and run.workers_lost >= MAX_WORKERS_LOST:
        message = (
            f"the workers running this run died {run.workers_lost} times (crashed, killed, or "
            "blocked by a tool); it is not passed on again"
        )
        return await finish(
            conn, run, Outcome("failed", error={"code": "worker_lost", "message": message})
        )
    step = machine.start(run)
    started = await runs_db.start_attempt(conn, run.id, step.status, lease)
    await writer.append(conn, run.id, step.events)
    return started


async def start_first(
    conn: AsyncConnection, run_id: str, lease: int, written: list[dict[str, Any]] | None = None
) -> runs_db.FirstStart | None:
    """`start` for a run never started and not being cancelled, in one statement on an
    autocommit connection (no lock taken first, no transaction of its own), which also reads
    what the run reads of its session to start (FirstStart.start); None: not such a run (the
    caller starts it under its row's lock). Its event's row is given to `written` (see
    writer.append)."""
    step = machine.first_start()
    ((kind, data),) = step.events
    first = await runs_db.start_first(
        conn, run_id, step.status, lease, event_store.run_event_ctes(kind, data)
    )
    if first is not None and written is not None:
        written += event_store.numbered([(run_id, kind, data)], {run_id: first.event_seq})
    return first


async def recover(conn: AsyncConnection, orphan: runs_db.Orphan) -> Run:
    """An unfinished run nobody will finish (locked by the caller): its worker died (its lease
    is gone), or its job ended without ending it. Its job is queued again, and the run resumes
    from the journal on whichever worker takes it."""
    run = orphan.run
    if run.status is RunStatus.RUNNING and run.lease is not None:
        # Its attempt is over: no lease until a worker starts the next one, so the run is
        # not taken for orphaned again meanwhile (and its worker is counted lost once).
        lost = run.workers_lost + (not await runs_db.lease_held(conn, run.lease))
        run = await runs_db.update_run(conn, run.id, {"workers_lost": lost, "lease": None})
    if run.job_id is not None:
        await jobs_db.end_job(conn, run.job_id)
    if run.cancel_mode:
        return await finish(conn, run, Outcome("cancelled"))
    job_id = await jobs_db.defer_run(conn, run.id, run.session_id, run.kind.value)
    return await runs_db.update_run(conn, run.id, {"job_id": job_id})


async def await_tool_outputs(
    conn: AsyncConnection, run: Run, calls: Sequence[dict[str, Any]], timeout_seconds: float
) -> Run:
    """Park the run until the client posts its tools' outputs, or the time runs out."""
    expires = func.now() + func.make_interval(0, 0, 0, 0, 0, 0, timeout_seconds)
    waiting = await runs_db.update_run(
        conn,
        run.id,
        {
            "status": machine.target(run, machine.Transition.AWAIT_TOOL_OUTPUTS),
            "action_expires_at": expires,
        },
    )
    assert waiting.action_expires_at is not None
    step = machine.await_tool_outputs(run, calls, waiting.action_expires_at.isoformat())
    await writer.append(conn, run.id, step.events)
    await webhooks.queue_run_event(
        conn, waiting, EventType.RUN_REQUIRES_ACTION, {"tool_calls": calls}
    )
    return waiting


async def await_approval(
    conn: AsyncConnection, run: Run, calls: Sequence[dict[str, Any]], timeout_seconds: float
) -> Run:
    """Park the run until a person rules on each of these calls ({tool_call_id, name,
    arguments}), or the time runs out (then they count as rejected)."""
    expires = func.now() + func.make_interval(0, 0, 0, 0, 0, 0, timeout_seconds)
    await approvals_db.request(conn, run.id, calls)
    waiting = await runs_db.update_run(
        conn,
        run.id,
        {
            "status": machine.target(run, machine.Transition.AWAIT_APPROVAL),
            "action_expires_at": expires,
        },
    )
    assert waiting.action_expires_at is not None
    step = machine.await_approval(run, calls, waiting.action_expires_at.isoformat())
    await writer.append(conn, run.id, step.events)
    return waiting


async def resume(
    conn: AsyncConnection, run: Run, committed: Sequence[Any], events: Sequence[Event] = ()
) -> Run:
    """The client's outputs are committed (or every approval was answered, which `events`
    announce): queue the run's job again."""
    step = machine.resume(run, committed, events)
    job_id = await jobs_db.defer_run(conn, run.id, run.session_id)
    resumed = await runs_db.update_run(
        conn, run.id, {"status": step.status.value, "action_expires_at": None, "job_id": job_id}
    )
    await writer.append(conn, run.id, step.events)
    return resumed


async def request_cancel(conn: AsyncConnection, run: Run, mode: CancelMode) -> Run:
    """With the run row locked: mark it, and end it now when no worker has it; a worker that
    has it stops and commits what it received. Who has it is its job's state, unless the
    attempt's worker died (its lease is lost): the job is then ended here. A run queued again
    between two attempts has no lease: its job may be a live worker's, which finishes it."""
    run = await runs_db.update_run(conn, run.id, {"cancel_mode": mode})
    if run.job_id is None or run.status in WAITING:
        # A parked run's worker let it go when it parked it, though it may still hold the job
        # that did (until it returns): nobody else would end it.
        return await finish(conn, run, Outcome("cancelled"))
    if run.status is RunStatus.RUNNING and await runs_db.lease_lost(conn, run.lease):
        await jobs_db.end_job(conn, run.job_id)  # its worker died: nobody else will end it
        return await finish(conn, run, Outcome("cancelled"))
    if await jobs_db.cancel_job(conn, run.job_id):  # no worker had taken it yet
        return await finish(conn, run, Outcome("cancelled"))
    return run


async def finish(
    conn: AsyncConnection,
    run: Run,
    outcome: Outcome,
    written: list[dict[str, Any]] | None = None,
    job_id: int | None = None,
    session_rev: int | None = None,
    session_as_read: int | None = None,
) -> Run:
    """Commit the end of `run` (locked by the caller, still active): its answer (partial ones
    marked incomplete), usage and run_end entries, a rollback if one was asked for, its row,
    the session's status and totals, and its last events (given to `written`: see
    writer.append); with `job_id` (the run's job, held by a worker of this process), the job's
    end too. Ending a run twice is refused by the caller's check that it is active: its end
    entries are written only here. `session_rev`: the session's rev as the caller's lock holds
    it (runs_db.lock_with_rev): the entries' seqs follow it, and all of it is one statement.

    `session_as_read` (with `session_rev`): the caller locked nothing, but read the session's
    row at this version (and rev), and `run` as its worker runs it: all of the end is one
    statement on `conn` (autocommit), written only if both rows are still so (runs_db.end_run's
    `as_read`); runs_db.Changed, with nothing written, if they are not or the end needs more
    than one statement."""
    outcome = machine.settled(run, outcome)
    model = outcome.model or run.model
    entries: list[NewEntry] = []
    if run.answers and (outcome.text or outcome.status == "completed"):
        content = list(outcome.parts) if outcome.parts else outcome.text
        payload: dict[str, Any] = {"role": "assistant", "content": content}
        if outcome.status != "completed":
            payload["status"] = "incomplete"
        if outcome.finish_reason is not None:
            payload["finish_reason"] = outcome.finish_reason
        if outcome.structured is not None:
            payload["structured"] = outcome.structured
        refs: dict[str, Any] = {"run_id": run.id}
        if outcome.context_from is not None:
            refs["context_from"] = outcome.context_from
        entries.append(NewEntry(EntryKind.MESSAGE, payload, refs, entry_id(run.id, "answer")))
    usage = outcome.usage
    cost = (
        cost_usd(
            model,
            usage.input_tokens,
            usage.output_tokens,
            usage.cached_tokens,
            usage.cache_write_tokens,
        )
        if usage
        else None
    )
    if usage is not None:
        usage_payload: dict[str, Any] = {
            "input_tokens": usage.input_tokens,
            "output_tokens": usage.output_tokens,
            "cached_tokens": usage.cached_tokens,
            "cache_write_tokens": usage.cache_write_tokens,
            "model": model,
        }
        if usage.estimated:
            usage_payload["estimated"] = True
        if usage.reasoning_tokens:
            usage_payload["reasoning_tokens"] = usage.reasoning_tokens
        if cost is not None:
            usage_payload["cost_usd"] = float(cost)
        entries.append(
            NewEntry(EntryKind.USAGE, usage_payload, {"run_id": run.id}, entry_id(run.id, "usage"))
        )
    end: dict[str, Any] = {"run_id": run.id, "status": outcome.status}
    if outcome.error:
        end["error"] = outcome.error
    entries.append(NewEntry(EntryKind.RUN_END, end, {"run_id": run.id}, entry_id(run.id, "end")))
    # The session's status and totals, set with the append's rev (one statement): idle unless
    # another run of it is still under way.
    ended_run = RunEnded(
        run.id,
        {
            "input_tokens": usage.input_tokens,
            "output_tokens": usage.output_tokens,
            "cached_tokens": usage.cached_tokens,
            "cache_write_tokens": usage.cache_write_tokens,
            "reasoning_tokens": usage.reasoning_tokens,
            "cost_usd": cost or 0,
        }
        if usage is not None
        else None,
    )
    # Fresh ids: they derive from the run, and only this transition writes them, in the
    # transaction that ends the run; the run is active (locked by the caller), so none is
    # stored yet (the unique index would refuse one all the same).
    rollback_asked = run.cancel_mode == "rollback" and run.user_entry_seq is not None
    part = (
        fresh_append(run.tenant_id, run.session_id, entries, ended_run, session_as_read)
        if session_rev is not None and not rollback_asked
        else None
    )
    if session_as_read is not None and part is None:
        raise runs_db.Changed(run.id)  # its entries need the append's checks: under the lock
    committed: list[Any]
    if part is not None and session_rev is not None:  # appended by the end's statement
        committed = [{**r, "seq": session_rev + 1 + i} for i, r in enumerate(part.rows)]
    else:
        appended = await append_in(
            conn, run.tenant_id, run.session_id, entries, fresh_ids=True, ended=ended_run
        )
        committed = list(appended.entries)
    end_seq = int(committed[-1]["seq"])
    if rollback_asked:
        rollback = NewEntry(
            EntryKind.ROLLBACK,
            {"from_seq": run.user_entry_seq, "to_seq": end_seq, "reason": "rollback"},
            {"run_id": run.id},
            entry_id(run.id, "rollback"),
        )
        more = await append_in(conn, run.tenant_id, run.session_id, [rollback])
        committed += list(more.entries)

    usage_data = (
        {
            "input_tokens": usage.input_tokens,
            "output_tokens": usage.output_tokens,
            "cached_tokens": usage.cached_tokens,
            "cache_write_tokens": usage.cache_write_tokens,
            "estimated": usage.estimated,
        }
        | ({"reasoning_tokens": usage.reasoning_tokens} if usage.reasoning_tokens else {})
        if usage
        else None
    )
    step = machine.end(
        run, outcome, committed, usage_data, float(cost) if cost is not None else None
    )
    # The row, the tenant's daily usage (quotas, reports: it outlives the session) and the
    # webhook endpoints that want the end: one statement.
    terminal = TERMINAL_BY_STATUS[step.status]
    usage_row = (
        tenants_db.usage_added(
            run.tenant_id,
            model,
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cached_tokens=usage.cached_tokens,
            cache_write_tokens=usage.cache_write_tokens,
            reasoning_tokens=usage.reasoning_tokens,
            cost_usd=cost,
        )
        if usage is not None
        else None
    )
    closed = await (_end_run_appending if part is not None else runs_db.end_run)(
        conn,
        run.id,
        {
            "status": step.status.value,
            "result": outcome.text or None,
            "finish_reason": outcome.finish_reason,
            "error": outcome.error,
            "input_tokens": usage.input_tokens if usage else 0,
            "output_tokens": usage.output_tokens if usage else 0,
            "cached_tokens": usage.cached_tokens if usage else 0,
            "cache_write_tokens": usage.cache_write_tokens if usage else 0,
            "reasoning_tokens": usage.reasoning_tokens if usage else 0,
            "usage_estimated": usage.estimated if usage else False,
            "cost_usd": cost,
            "end_entry_seq": end_seq,
        },
        usage_row,
        webhooks_db.wanting_values(run.tenant_id, run.session_id, terminal),
        job_id,
        event_store.closing_events(step.events),  # written by it unless steers are pending
        (part.statement, part.params) if part is not None else None,
        run.attempts if session_as_read is not None else None,
    )
    ended = closed.run
    if closed.last_event_seq is not None:
        if written is not None:
            rows = [(run.id, kind, data) for kind, data in step.events]
            written += event_store.numbered(rows, {run.id: closed.last_event_seq})
    else:  # the steers' events come first
        steered = await _hand_on_steers(conn, run, step.status) if closed.steers_pending else []
        await writer.append(conn, run.id, [*steered, *step.events], written)
    metrics.run_ended(
        run.kind, step.status, ended.created_at, ended.ended_at, model_labels(model), usage, cost
    )
    await webhooks.queue_run_event(conn, ended, terminal, endpoints=closed.webhook_endpoints)
    return ended


async def _hand_on_steers(conn: AsyncConnection, run: Run, status: RunStatus) -> list[Event]:
    """The messages sent to the run that its end came before (steers still pending): they
    start the next run, one run for all of them; a cancelled run's are journaled as messages
    and start nothing (the user stopped the run). Their run.steered events, for the run's end.

    The run's row is locked by the caller, and a steer is committed under the same lock
    (app/services/asks.py): every steer of an ended run is settled here or delivered before."""
    pending = await steers_db.pending_steers(conn, run.id, lock=True)
    if not pending:
        return []
    if status is RunStatus.CANCELLED:
        kept = [
            NewEntry(
                EntryKind.MESSAGE,
                {"role": "user", "content": s.content},
                {"steer_id": s.id},
                entry_id(run.id, f"steer:{s.id}"),
            )
            for s in pending
        ]
        appended = await append_in(conn, run.tenant_id, run.session_id, kept, fresh_ids=True)
        events: list[Event] = []
        for steer, entry in zip(pending, appended.entries, strict=True):
            await steers_db.settle(conn, steer.id, "journaled", int(entry["seq"]))
            data = {"steer_id": steer.id, "entry_seq": entry["seq"], "text": text_of(steer.content)}
            events.append((EventType.RUN_STEERED, data))
        return events
    next_id = str(uuid.uuid4())
    first = pending[0]
    messages = [
        NewEntry(
            EntryKind.MESSAGE,
            {"role": "user", "content": s.content},
            # The first is the next run's input; later ones are steered into it.
            {"run_id": next_id, "from_steer_id": s.id}
            if i == 0
            else {"run_id": next_id, "steer_id": s.id},
            entry_id(next_id, "input" if i == 0 else f"steer:{s.id}"),
        )
        for i, s in enumerate(pending)
    ]
    start = NewEntry(
        EntryKind.RUN_START,
        {"run_id": next_id, "model": first.model},
        {"run_id": next_id},
        entry_id(next_id, "start"),
    )
    appended = await append_in(
        conn,
        run.tenant_id,
        run.session_id,
        [*messages, start],
        fresh_ids=True,  # derived from next_id, a new uuid4
        session_values={"status": "active"},  # the next run's
    )
    input_seq = int(appended.entries[0]["seq"])
    await create(
        conn,
        id=next_id,
        tenant_id=run.tenant_id,
        session_id=run.session_id,
        kind=RunKind.ASK,
        model=first.model,
        params=RunParams.from_json(first.params),
        idempotency_key=None,
        user_entry_seq=input_seq,
        session_marked_active=True,
    )
    events = []
    for steer, entry in zip(pending, appended.entries[: len(pending)], strict=True):
        await steers_db.settle(conn, steer.id, "next_run", int(entry["seq"]), next_id)
        data = {"steer_id": steer.id, "entry_seq": int(entry["seq"]), "next_run_id": next_id}
        data["text"] = text_of(steer.content)
        events.append((EventType.RUN_STEERED, data))
    return events
