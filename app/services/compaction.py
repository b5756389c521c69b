"""Compaction use cases: queue a compaction job; plan, summarize and commit a summary checkpoint.

A compaction job is a run of kind `compaction`: it shares the session's job lock with asks (so it
never overlaps a run), its events stream like an ask's, and it can be waited on and cancelled.
A run also compacts on its own when its context fills up (app/worker/compaction.py).
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import RowMapping
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from app.config import Settings
from app.core.compaction import (
    MIN_CHUNK_TOKENS,
    CompactionPlan,
    chunk_lines,
    nothing_to_compact,
    plan_compaction,
    reaches_checkpoint,
    replaced_tokens,
    summary_problem,
    summary_request,
    transcript_lines,
)
from app.core.entries import EntryKind, NewEntry
from app.core.policy import ContextPolicy
from app.core.projection import SUMMARY_CUT_MARK, cut_to_tokens
from app.core.runs import Run, RunKind, RunParams, entry_id
from app.core.sessions import SessionConfig
from app.core.tokens import TokenCounter, request_tokens
from app.core.usage import UsageReport
from app.db import journal as journal_db
from app.db import runs as runs_db
from app.db import sessions as sessions_db
from app.db.engine import read_snapshot
from app.llm.base import Finish, ModelRequest, TextDelta
from app.llm.catalog import context_window_for
from app.llm.router import Router
from app.llm.tokenizers import ModelCounting, counting_for
from app.services import run_transitions
from app.services.asks import run_by_idempotency_key
from app.services.errors import Conflict, Invalid, ServiceError, session_not_found
from app.services.journal import append_in
from app.services.projection import resolve_policy
from app.telemetry import metrics

# Slack under the summarizer's budget: transcript lines are counted one by one, and tokens
# can merge differently once the lines are joined.
CHUNK_SLACK = 0.02
CHUNK_SLACK_TOKENS = 16


# Stop reasons of an answer cut off at max_output_tokens (OpenAI's, Anthropic's): such a summary
# would end mid-sentence, so it is not committed.
TRUNCATED = frozenset({"length", "max_tokens"})
# The longest summary asked for: enough for a long session's state, small next to any window.
SUMMARY_MAX_TOKENS = 4_000


# How often a compaction reports its progress while the summarizer writes (a small local model
# takes tens of seconds).
PROGRESS_SECONDS = 1.0


class CompactionFailed(ServiceError):
    """The summarizer gave nothing usable."""


@dataclass(frozen=True)
class Progress:
    call: int  # the summarizer call under way (1-based): one per transcript chunk
    calls: int
    chars: int  # characters of summary the call has written so far


ProgressHook = Callable[[Progress], None]


@dataclass(frozen=True)
class PreparedCompaction:
    tenant_id: str
    session_id: str
    basis_rev: int  # the thread's rev when planned: later summaries or rollbacks void the plan
    plan: CompactionPlan
    model: str  # the summarization model, provider:name
    policy: ContextPolicy  # resolved for that model: its budget bounds every summarizer call
    counting: ModelCounting
    focus: str | None
    summary_tokens: int  # the cap on the summary's length (the call's max_output_tokens)
    chunk_tokens: int  # the most transcript one summarizer call may carry
    previous: str | None  # the summary folded in, cut if it would crowd the transcript out
    reader_counting: ModelCounting  # how the model that reads the summary counts it
    reader_tokens: int  # the most the summary may take by that count (margin included)


@dataclass(frozen=True)
class Summary:
    content: str
    model: str  # the model that wrote it
    usage: UsageReport | None
    calls: int  # summarizer calls: one per transcript chunk
    cut: bool = False  # longer than its cap (an upstream ignoring max_tokens): cut with a mark


def summarization_model(config: SessionConfig, settings: Settings) -> str:
    """The session's summarization model, else its model, else the server's default."""
    return config.summarization_model or config.model or settings.default_model


async def prepare(
    engine: AsyncEngine,
    settings: Settings,
    tenant_id: str,
    session_id: str,
    *,
    keep_last_turns: int | None = None,
    model: str | None = None,
    focus: str | None = None,
    run_id: str | None = None,
    answer_model: str | None = None,
    policy_overrides: Mapping[str, Any] | None = None,
) -> PreparedCompaction | None:
    """What a compaction would summarize now, and how; None when there is nothing before the
    turns it keeps. Reads the thread back to its latest checkpoint; writes nothing.

    `run_id`: compacting for that run (later asks stay out); `answer_model`: the model that will
    read the summary (default the session's), whose budget bounds the summary's length."""
    async with read_snapshot(engine) as conn:
        session = await sessions_db.get_session(conn, tenant_id, session_id)
        if session is None:
            raise session_not_found(session_id)
        config = session.config
        model = model or summarization_model(config, settings)
        layers = (settings.context_policy, config.context_policy, policy_overrides)
        policy = resolve_policy(await context_window_for(settings, model), *layers)
        reader = answer_model or config.model or settings.default_model
        reader_policy = resolve_policy(await context_window_for(settings, reader), *layers)
        reader_budget = reader_policy.budget
        thread = session.thread
        tail, _ = await journal_db.read_tail(conn, thread, reaches_checkpoint)
        # Runs not ended have answers to come: their turns are never summarized.
        active = await runs_db.active_runs(conn, session_id, kind="ask", tenant_id=tenant_id)
        open_runs = {r.id for r in active if r.id != run_id}
    keep = policy.keep_last_turns if keep_last_turns is None else keep_last_turns
    plan = plan_compaction(tail, keep, run_id, open_runs)
    if plan is None:
        return None
    counting = counting_for(model, policy.token_estimator)
    summary_tokens = max(
        16, min(policy.reserve, policy.budget // 4, reader_budget // 4, SUMMARY_MAX_TOKENS)
    )
    counter = counting.counter
    words = _words(summary_tokens)
    margin = 0.0 if counting.exact else policy.estimate_margin
    room = math.floor(policy.budget / (1 + margin) * (1 - CHUNK_SLACK)) - CHUNK_SLACK_TOKENS
    # The fixed part of every call: instructions, labels, focus, and the summary so far (at
    # most as long as the longer of the previous summary and the cap on a new one).
    instructions = request_tokens(summary_request("-", [""], focus, words), (), counter)
    previous = str(plan.previous.payload["content"]) if plan.previous is not None else None
    if previous is not None:
        # A previous summary too large for this summarizer (a client's, or one written for a
        # larger window) is folded in cut, rather than making every compaction fail.
        previous = _fit(previous, counter, max(summary_tokens, (room - instructions) // 2))
    fixed = instructions + max(summary_tokens, counter.count(previous or ""))
    chunk_tokens = room - fixed
    if chunk_tokens < MIN_CHUNK_TOKENS:
        raise Invalid(
            "summarizer_window_too_small",
            f"the summarization model's budget of {policy.budget} tokens leaves no room for "
            f"the conversation after {fixed} tokens of instructions and summary",
            {"model": model, "budget": policy.budget, "fixed_tokens": fixed},
        )
    reader_counting = counting_for(reader, reader_policy.token_estimator)
    reader_margin = 0.0 if reader_counting.exact else reader_policy.estimate_margin
    reader_tokens = max(
        16, math.floor(min(reader_budget // 4, SUMMARY_MAX_TOKENS) / (1 + reader_margin))
    )
    return PreparedCompaction(
        tenant_id,
        session_id,
        session.rev,
        plan,
        model,
        policy,
        counting,
        focus,
        summary_tokens,
        chunk_tokens,
        previous,
        reader_counting,
        reader_tokens,
    )


def _fit(text: str, counter: TokenCounter, limit: int) -> str:
    """`text`, or its longest prefix that fits `limit` tokens with SUMMARY_CUT_MARK."""
    if counter.count(text) <= limit:
        return text
    return cut_to_tokens(text, counter, limit, SUMMARY_CUT_MARK) or ""


def _words(tokens: int) -> int:
    return max(10, int(tokens * 0.6))  # English runs about 1.3 tokens a word; leave room


def _word_target(cap_tokens: int, chunk: Sequence[str], counter: TokenCounter) -> int:
    """Words to ask for: the cap, but no more than about a third of what is summarized (a short
    conversation asked for ~900 words made small models ramble to their limit)."""
    transcript = sum(counter.count(line) for line in chunk)
    return min(_words(cap_tokens), max(_words(transcript // 3), 40))


def _complete_part(text: str) -> str:
    """What an answer cut off at its length limit said completely: up to its last line break or
    sentence end, when that keeps at least half of it."""
    end = max(text.rfind("\n"), *(text.rfind(stop) + 1 for stop in (". ", "! ", "? ")))
    return text[:end].rstrip() if end >= len(text) // 2 else text.rstrip()


@metrics.timed_compaction
async def summarize(
    router: Router, prepared: PreparedCompaction, progress: ProgressHook | None = None
) -> Summary:
    """Fold the transcript into the summary so far, one chunk per call (usually a single one);
    `progress` hears at each call's start and about once a second while it writes.

    Raises ProviderError when the model fails, CompactionFailed when its answer is not a usable
    summary: empty, echoing the prompt (see summary_problem), or no shorter than what it would
    replace, by the count of the model that reads it (it would grow the context)."""
    plan, counter = prepared.plan, prepared.counting.counter
    content = prepared.previous
    usage: UsageReport | None = None
    used = prepared.model
    cut = False
    chunks = chunk_lines(transcript_lines(plan.entries), counter, prepared.chunk_tokens)
    for number, chunk in enumerate(chunks, 1):
        if progress is not None:
            progress(Progress(number, len(chunks), 0))
        reported = time.monotonic()
        written = 0
        words = _word_target(prepared.summary_tokens, chunk, counter)
        messages = summary_request(content, chunk, prepared.focus, words)
        request = ModelRequest(
            model=prepared.model.partition(":")[2],
            messages=messages,
            max_output_tokens=prepared.summary_tokens,
        )
        parts: list[str] = []
        reached_limit = False
        async for model, event in router.stream(prepared.model, request):
            used = model
            if isinstance(event, TextDelta):
                parts.append(event.text)
                written += len(event.text)
                if progress is not None and time.monotonic() - reported >= PROGRESS_SECONDS:
                    reported = time.monotonic()
                    progress(Progress(number, len(chunks), written))
            elif isinstance(event, UsageReport):
                usage = event.plus(usage)
            elif isinstance(event, Finish) and event.reason in TRUNCATED:
                reached_limit = True
        text = "".join(parts).strip()
        if reached_limit and text:
            # Cut off at its limit: kept up to what it said completely, marked as cut, rather
            # than failing (a small model that rambles would otherwise never compact).
            text = _complete_part(text) + SUMMARY_CUT_MARK
        if not text:
            raise CompactionFailed("empty_summary", "the summarization model answered nothing")
        _check(text)
        # Not every upstream honours max_tokens: the next call folds this in, so it must fit.
        content = _fit(text, counter, prepared.summary_tokens)
        cut = cut or reached_limit or content != text
    assert content is not None
    # Checked as the model that reads it counts: a summary over its share of that model's
    # budget would crowd out the turns after it (or, over the budget, be cut at every ask).
    reader = prepared.reader_counting.counter
    fitted = _fit(content, reader, prepared.reader_tokens)
    tokens, replaced = reader.count(fitted), replaced_tokens(plan, reader)
    if tokens >= replaced:
        raise CompactionFailed(
            "summary_not_shorter",
            f"the summary has {tokens} tokens, no fewer than the {replaced} of the history it "
            "would replace: nothing was committed, and the context goes on with windowing",
            {"summary_tokens": tokens, "replaced_tokens": replaced},
        )
    return Summary(fitted, used, usage, len(chunks), cut or fitted != content)


def _check(text: str) -> None:
    problem = summary_problem(text)
    if problem is not None:
        raise CompactionFailed(
            "summary_echoes_prompt",
            f"{problem}: nothing was committed, and the context goes on with windowing",
        )


async def commit(
    engine: AsyncEngine,
    prepared: PreparedCompaction,
    summary: Summary,
    summary_id: str,
    refs: dict[str, Any],
) -> RowMapping:
    """Append the summary checkpoint (idempotent by `summary_id`); returns its entry."""
    plan = prepared.plan
    payload: dict[str, Any] = {
        "from_seq": plan.from_seq,
        "to_seq": plan.to_seq,
        "content": summary.content,
        "model": summary.model,
    }
    if prepared.focus:
        payload["focus"] = prepared.focus
    entry = NewEntry(EntryKind.SUMMARY, payload, refs, summary_id)
    async with engine.begin() as conn:
        session = await sessions_db.get_session(
            conn, prepared.tenant_id, prepared.session_id, lock=True
        )
        if session is None:
            raise session_not_found(prepared.session_id)
        thread = session.thread
        # A summary or rollback appended meanwhile (by a client) changes what the plan covers:
        # committing it anyway would hide that checkpoint or bring rolled-back entries back.
        newer = await journal_db.read_entries(
            conn,
            thread,
            after_seq=prepared.basis_rev,
            kinds=[EntryKind.SUMMARY, EntryKind.ROLLBACK],
            limit=1,
        )
        if newer and newer[0]["id"] != summary_id:
            raise CompactionFailed(
                "compaction_superseded",
                f"a {newer[0]['kind']} entry (seq {newer[0]['seq']}) was appended while the "
                "summary was written; compact again",
                {"seq": int(newer[0]["seq"])},
            )
        appended = await append_in(conn, prepared.tenant_id, prepared.session_id, [entry])
    return appended.entries[0]


async def committed_summary(
    engine: AsyncEngine, tenant_id: str, session_id: str, summary_id: str
) -> RowMapping | None:
    """The summary entry `summary_id`, if an earlier attempt of the job already committed it."""
    async with engine.connect() as conn:
        session = await sessions_db.get_session(conn, tenant_id, session_id)
        if session is None:
            return None
        thread = session.thread
        if not thread:
            return None
        found = await journal_db.find_by_entry_ids(conn, thread, [summary_id])
    return found[0] if found and found[0]["kind"] == EntryKind.SUMMARY else None


@dataclass(frozen=True)
class CompactParams:
    focus: str | None = None
    keep_last_turns: int | None = None
    model: str | None = None
    idempotency_key: str | None = None


async def request_compaction(
    engine: AsyncEngine, settings: Settings, tenant_id: str, session_id: str, params: CompactParams
) -> tuple[Run, bool]:
    """Queue a compaction job; returns (its run, created). Refused with 409 when there is
    nothing to compact and no run in progress could add anything."""
    if params.idempotency_key:
        key = params.idempotency_key
        earlier = await run_by_idempotency_key(engine, tenant_id, session_id, key, "compaction")
        if earlier is not None:
            return earlier, False
    prepared = await prepare(
        engine,
        settings,
        tenant_id,
        session_id,
        keep_last_turns=params.keep_last_turns,
        model=params.model,
        focus=params.focus,
    )
    try:
        async with engine.begin() as conn:
            session = await sessions_db.get_session(conn, tenant_id, session_id, lock=True)
            if session is None:
                raise session_not_found(session_id)
            if prepared is None and not await runs_db.active_runs(
                conn, session_id, kind="ask", tenant_id=tenant_id
            ):
                keep = await _kept_turns(settings, session.config, params)
                raise Conflict(
                    "nothing_to_compact",
                    nothing_to_compact(keep),
                    # for a client: a lower keep_last_turns summarizes some of the kept turns
                    {"keep_last_turns": keep},
                )
            model = prepared.model if prepared else params.model
            model = model or summarization_model(session.config, settings)
            return await _queue(conn, tenant_id, session_id, model, params), True
    except IntegrityError as exc:
        if "runs_idempotency_key" not in str(exc.orig) or not params.idempotency_key:
            raise
    key = params.idempotency_key
    earlier = await run_by_idempotency_key(engine, tenant_id, session_id, key, "compaction")
    assert earlier is not None
    return earlier, False


async def _kept_turns(settings: Settings, config: SessionConfig, params: CompactParams) -> int:
    """The turns a compaction with `params` keeps raw: the request's, else the policy's."""
    if params.keep_last_turns is not None:
        return params.keep_last_turns
    model = params.model or summarization_model(config, settings)
    window = await context_window_for(settings, model)
    policy = resolve_policy(window, settings.context_policy, config.context_policy)
    return policy.keep_last_turns


async def _queue(
    conn: Any, tenant_id: str, session_id: str, model: str, params: CompactParams
) -> Run:
    run_id = str(uuid.uuid4())
    refs = {"run_id": run_id}
    start = NewEntry(
        EntryKind.RUN_START,
        {"run_id": run_id, "model": model, "kind": "compaction"},
        refs,
        entry_id(run_id, "start"),
    )
    await append_in(conn, tenant_id, session_id, [start])
    queued = await run_transitions.create(
        conn,
        id=run_id,
        tenant_id=tenant_id,
        session_id=session_id,
        kind=RunKind.COMPACTION,
        model=model,
        params=RunParams(focus=params.focus, keep_last_turns=params.keep_last_turns),
        idempotency_key=params.idempotency_key,
    )
    return queued.run
