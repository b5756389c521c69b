"""AI SDK chats as sessions: a chat id names a session, a regenerate is a rollback and an ask
(committed together: asks.ask).

The frontend (`useChat`) keeps its own copy of the conversation and sends all of it; the
session's journal stays the source of truth, so only the newest user message is taken from it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import RowMapping
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.config import Settings
from app.core.entries import EntryKind, NewEntry
from app.core.runs import RunStatus
from app.core.sessions import Session
from app.core.ui_messages import KINDS, UIMessage, ui_messages
from app.db import journal as journal_db
from app.db import runs as runs_db
from app.db import sessions as sessions_db
from app.db.engine import autocommit
from app.eventlog import store as event_store
from app.eventlog.registry import EventType
from app.services import approvals, asks, journal, quotas, runs
from app.services.errors import Conflict, Invalid, NotFound, ServiceError, session_not_found
from app.services.handoff import RunHandoff
from app.services.ids import is_uuid
from app.telemetry import metrics

# Sessions made for chats get ids derived from this namespace, the tenant and the chat id.
CHAT_NAMESPACE = uuid.UUID("6f1c2a0e-5b7d-4c3e-9a8f-1d2e3f4a5b6c")
CHAT_ID_KEY = "ai_sdk_chat_id"  # the metadata key holding the chat id of such a session
MAX_CHAT_ID_LENGTH = 512


def derived_session_id(tenant_id: str, chat_id: str) -> str:
    return str(uuid.uuid5(CHAT_NAMESPACE, f"{tenant_id}/{chat_id}"))


async def find_session(engine: AsyncEngine, tenant_id: str, chat_id: str) -> Session | None:
    """The chat's session: the session whose id the chat id is, else the one made for it."""
    async with autocommit(engine) as conn:  # reads of one statement each
        if is_uuid(chat_id):
            own = await sessions_db.get_session(conn, tenant_id, chat_id)
            if own is not None:
                return own
        return await sessions_db.get_session(
            conn, tenant_id, derived_session_id(tenant_id, chat_id)
        )


def _making_session(
    settings: Settings, tenant_id: str, chat_id: str, session_id: str
) -> asks.Prepare:
    """The chat's session, made in its first ask's transaction (with the default config),
    within the tenant's session limit."""

    async def make(conn: AsyncConnection) -> None:
        await quotas.check_new_session(conn, settings, tenant_id)
        try:
            async with conn.begin_nested():
                await sessions_db.insert_session(
                    conn,
                    id=session_id,
                    tenant_id=tenant_id,
                    title=None,
                    metadata={CHAT_ID_KEY: chat_id},
                    config={},
                    expires_at=sessions_db.tenant_default_expiry(tenant_id),
                )
        except IntegrityError:  # a concurrent first message made it, or it expired
            if await sessions_db.get_session(conn, tenant_id, session_id) is None:
                raise session_not_found(session_id) from None  # expired: gone for the tenant

    return make


def no_user_message(messages: list[dict[str, Any]]) -> Invalid:
    return Invalid(
        "no_user_message",
        "the last message must be the user's new message (or, once the chat's run waits for "
        "client-side tool outputs, the answer with them)",
        {"loc": ["body", "messages", len(messages) - 1]},
    )


# The AI SDK's file parts the service reads, by media type: documents, and images.
DOCUMENT_FILE_TYPES = frozenset({"application/pdf", "text/plain"})


def new_user_content(messages: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """The content of the last message, which must be the user's: the one to journal. Its
    text parts joined, when it has no file; else its parts in their order, its file parts
    (useChat's attachments, as data URLs) as document parts (PDF, plain text) or image parts.
    What the content rules refuse (a PDF that is not one, a size) is checked by the ask."""
    if not messages or messages[-1].get("role") != "user":
        raise no_user_message(messages)
    where: list[str | int] = ["body", "messages", len(messages) - 1, "parts"]
    content: list[dict[str, Any]] = []
    for at, part in enumerate(messages[-1].get("parts") or []):
        if not isinstance(part, dict):
            continue
        if part.get("type") == "text" and isinstance(part.get("text"), str):
            content.append({"type": "text", "text": part["text"]})
        elif part.get("type") == "file":
            content.append(_file_content(part, [*where, at]))
    texts = [p["text"] for p in content if p["type"] == "text"]
    if len(texts) == len(content):  # no file: the text, as it always was
        if not "".join(texts).strip():
            raise Invalid("empty_message", "the user's message has no text part", {"loc": where})
        return "\n\n".join(texts)
    return [p for p in content if p["type"] != "text" or p["text"].strip()]


def _file_content(part: dict[str, Any], loc: list[str | int]) -> dict[str, Any]:
    media_type, url = part.get("mediaType"), part.get("url")
    if not isinstance(url, str) or not url.startswith("data:"):
        message = "a file part must carry its bytes as a data: URL (as useChat sends files)"
        raise Invalid("unsupported_file", message, {"loc": [*loc, "url"]})
    if media_type in DOCUMENT_FILE_TYPES:
        document: dict[str, Any] = {"type": "document", "url": url}
        if isinstance(part.get("filename"), str):
            document["filename"] = part["filename"]
        return document
    if isinstance(media_type, str) and media_type.startswith("image/"):
        return {"type": "image_url", "url": url}
    allowed = ", ".join([*sorted(DOCUMENT_FILE_TYPES), "image/*"])
    message = f"file type {str(media_type)[:64]!r} is not one of {allowed}"
    raise Invalid("unsupported_file", message, {"loc": [*loc, "mediaType"]})


async def live_user_messages(
    engine: AsyncEngine, tenant_id: str, session_id: str
) -> tuple[list[RowMapping], int]:
    """The session's user messages that no rollback took out, oldest first, and the rev they
    were read at: the user messages the chat shows."""
    messages, rev = await journal.live_entries(
        engine, tenant_id, session_id, [str(EntryKind.MESSAGE)]
    )
    return [m for m in messages if m["payload"].get("role") == "user"], rev


@dataclass(frozen=True)
class Rollback:
    """A rollback to commit with an ask: the user message it takes out (from it on)."""

    entry: NewEntry
    rev: int  # the session's rev when it was read: an entry appended since voids it (409)
    content: str | list[dict[str, Any]]  # the user message taken out


async def rollback_from(
    engine: AsyncEngine, tenant_id: str, session_id: str, position: int | None, reason: str
) -> Rollback | None:
    """A rollback of the chat's user message at `position` (0-based among the chat's user
    messages; None: the last one) and everything after it, for a regenerate or an edit; None
    when there is no such message (nothing to take out). Only read: the ask commits it.
    `reason`: the rollback entry's."""
    async with engine.connect() as conn:
        active = await runs_db.active_runs(conn, session_id, kind="ask", tenant_id=tenant_id)
    if active:
        raise Conflict(
            "session_busy",
            "the chat has a run in progress; stop it first",
            {"active_run_id": active[-1].id},
        )
    live, rev = await live_user_messages(engine, tenant_id, session_id)
    if position is None:
        position = len(live) - 1
    if not 0 <= position < len(live):
        return None
    entry = live[position]
    rollback = NewEntry(
        EntryKind.ROLLBACK, {"from_seq": entry["seq"], "to_seq": rev, "reason": reason}, {}
    )
    return Rollback(rollback, rev, entry["payload"]["content"])


def _rolling_back(tenant_id: str, session_id: str, rollback: Rollback) -> asks.Prepare:
    async def roll_back(conn: AsyncConnection) -> None:
        # expected_rev: an entry appended meanwhile would not be one the client meant to void.
        await journal.append_in(
            conn, tenant_id, session_id, [rollback.entry], expected_rev=rollback.rev
        )

    return roll_back


@metrics.counted_ask(refusals=ServiceError)  # once, whichever of its sessions it tried
async def ask(
    engine: AsyncEngine,
    settings: Settings,
    tenant_id: str,
    chat_id: str,
    messages: list[dict[str, Any]],
    *,
    regenerate: bool,
    edited: bool,
    params: asks.AskParams,
    handoff: RunHandoff | None,
    own_limits: quotas.Limits | None = None,
) -> asks.AskResult:
    """The chat's ask: its new user message (made the chat's session on its first), or the
    last one again (`regenerate`), or an edited one (`edited`: the chat's user messages up to
    it are `messages`); a regenerate or an edit rolls back from the message it replaces. All
    of it is committed with the ask, or nothing is (asks.ask). `params.content` is ignored."""
    prepare: asks.Prepare | None = None
    if regenerate:
        session = await find_session(engine, tenant_id, chat_id)
        nothing = Invalid("nothing_to_regenerate", "the chat has no user message yet", {})
        if session is None:
            raise nothing
        session_id = session.id
        rollback = await rollback_from(engine, tenant_id, session_id, None, "regenerate")
        if rollback is None:
            raise nothing
        content = rollback.content
        prepare = _rolling_back(tenant_id, session_id, rollback)
    elif not edited:
        # The chat's session is asked directly, as find_session would find it: one read
        # fewer, the ask's own read finding it (or finding none: the chat's first message).
        asked = replace(params, content=new_user_content(messages))
        candidates = [chat_id] if is_uuid(chat_id) else []
        for session_id in [*candidates, derived_session_id(tenant_id, chat_id)]:
            try:
                return await _asked(
                    engine, settings, tenant_id, session_id, asked, own_limits, handoff, None
                )
            except NotFound as exc:
                if exc.code != "session_not_found":
                    raise
        session_id = derived_session_id(tenant_id, chat_id)
        prepare = _making_session(settings, tenant_id, chat_id, session_id)
        return await _asked(
            engine, settings, tenant_id, session_id, asked, own_limits, handoff, prepare
        )
    else:  # an edited message
        content = new_user_content(messages)
        session = await find_session(engine, tenant_id, chat_id)
        if session is None:
            session_id = derived_session_id(tenant_id, chat_id)
            prepare = _making_session(settings, tenant_id, chat_id, session_id)
        else:
            session_id = session.id
            # useChat sends the messages up to the edited one, which is last. It is the chat's
            # n-th user message: that one and all after it are rolled back.
            position = sum(1 for m in messages if m.get("role") == "user") - 1
            rollback = await rollback_from(engine, tenant_id, session_id, position, "edit")
            if rollback is not None:
                prepare = _rolling_back(tenant_id, session_id, rollback)
    return await _asked(
        engine,
        settings,
        tenant_id,
        session_id,
        replace(params, content=content),
        own_limits,
        handoff,
        prepare,
    )


async def _asked(
    engine: AsyncEngine,
    settings: Settings,
    tenant_id: str,
    session_id: str,
    params: asks.AskParams,
    own_limits: quotas.Limits | None,
    handoff: RunHandoff | None,
    prepare: asks.Prepare | None,
) -> asks.AskResult:
    return await asks.ask_uncounted(
        engine,
        settings,
        tenant_id,
        session_id,
        params,
        own_limits,
        handoff=handoff,
        prepare=prepare,
        followed=True,  # the chat's answer is its run's stream
    )


async def steer(
    engine: AsyncEngine,
    settings: Settings,
    tenant_id: str,
    chat_id: str,
    message: dict[str, Any],
    handoff: RunHandoff | None,
    own_limits: quotas.Limits | None = None,
) -> asks.AskResult:
    """A user message sent while the chat's run works (`message`: a UI message, its text and
    file parts): steered into that run (asks' `steer`), or, with no run in progress, asked."""
    content = new_user_content([message])
    session = await find_session(engine, tenant_id, chat_id)
    if session is None:
        raise NotFound("chat_not_found", f"the chat {chat_id} has no session yet", {})
    params = asks.AskParams(content=content, multitask_strategy="steer")
    return await asks.ask(
        engine, settings, tenant_id, session.id, params, own_limits, handoff=handoff
    )


async def chat_messages(
    engine: AsyncEngine, tenant_id: str, chat_id: str, major: int
) -> list[UIMessage]:
    """The chat's history as UI messages (none for a chat with no session yet): what no
    rollback took out, from the journal, for a client of `ai` major `major`: the calls its run
    waits to have approved ask for it (`ai` 6 on), steered messages are steering-message parts
    (`ai` 7 on)."""
    session = await find_session(engine, tenant_id, chat_id)
    if session is None:
        return []
    rows, _ = await journal.live_entries(engine, tenant_id, session.id, [str(k) for k in KINDS])
    waiting: list[str] = []
    run = await runs.active_run(engine, tenant_id, session.id)
    if major >= 6 and run is not None and run.status == RunStatus.AWAITING_APPROVAL:
        pending = (await approvals.run_approvals(engine, tenant_id, run.id)).approvals
        waiting = [a.tool_call_id for a in pending if a.decision is None]
    entries = [journal_db.journal_entry(row) for row in rows]
    return ui_messages(entries, steering_parts=major >= 7, waiting=waiting)


@dataclass(frozen=True)
class ToolOutputs:
    run_id: str
    streamed_through: int  # the run's last event seq before the outputs were sent


async def submit_answers(
    engine: AsyncEngine, tenant_id: str, session_id: str, message: dict[str, Any]
) -> ToolOutputs:
    """What the chat's run waits on, from the assistant message useChat sends back: the
    rulings on its tool calls (`addToolApprovalResponse`) when it awaits approval, else the
    outputs of the client-side tool calls its onToolCall handlers gave (`addToolOutput`)."""
    run = await runs.active_run(engine, tenant_id, session_id)
    if run is None:
        raise Conflict("run_not_waiting", "the chat has no run waiting for tool outputs", {})
    async with engine.connect() as conn:
        seen = (await event_store.read_backlog(conn, run.id, event_store.MAX_EVENT_SEQ, 1)).last_seq
        if run.status != RunStatus.AWAITING_APPROVAL and _ruled(message):
            # Every call was ruled on through the API already (edited arguments) and the run
            # went on: the client's stream ended where the run began to wait.
            waited = EventType.RUN_AWAITING_APPROVAL
            return ToolOutputs(run.id, await event_store.last_seq_of_type(conn, run.id, waited))
    if run.status == RunStatus.AWAITING_APPROVAL:
        # Calls ruled on already (through the API, e.g. with edited arguments) are left be.
        waiting = {
            a.tool_call_id
            for a in (await approvals.run_approvals(engine, tenant_id, run.id)).approvals
            if a.decision is None
        }
        rulings = [r for r in _rulings(message) if r.tool_call_id in waiting]
        if rulings:
            await approvals.answer(engine, tenant_id, run.id, rulings)
        return ToolOutputs(run.id, seen)
    await runs.submit_tool_outputs(engine, tenant_id, run.id, _tool_outputs(message))
    return ToolOutputs(run.id, seen)


def _ruled(message: dict[str, Any]) -> bool:
    parts = message.get("parts") or []
    return any(isinstance(p, dict) and p.get("state") == "approval-responded" for p in parts)


def _rulings(message: dict[str, Any]) -> list[approvals.Answer]:
    """The tool parts a person ruled on (state `approval-responded`; the approval's id is the
    call's)."""
    rulings = []
    for part in message.get("parts") or []:
        approval = part.get("approval") if isinstance(part, dict) else None
        if part.get("state") != "approval-responded" or not isinstance(approval, dict):
            continue
        reason = approval.get("reason")
        rulings.append(
            approvals.Answer(
                str(approval.get("id")),
                approval.get("approved") is True,
                reason=reason if isinstance(reason, str) and reason else None,
            )
        )
    if not rulings:
        raise Invalid("no_approvals", "the run awaits approval: no tool part was ruled on", {})
    return rulings


def _tool_outputs(message: dict[str, Any]) -> list[runs.ToolOutput]:
    return [
        runs.ToolOutput(p["toolCallId"], p.get("errorText", ""), is_error=True)
        if p["state"] == "output-error"
        else runs.ToolOutput(p["toolCallId"], p.get("output"))
        for p in message.get("parts") or []
        if isinstance(p, dict)
        and (str(p.get("type", "")).startswith("tool-") or p.get("type") == "dynamic-tool")
        and not p.get("providerExecuted")
        and p.get("state") in ("output-available", "output-error")
        and isinstance(p.get("toolCallId"), str)
    ]


async def events_after(engine: AsyncEngine, run_id: str, seq: int) -> bool:
    """Whether the run has events after `seq` (a replayed run.requires_action was answered)."""
    async with engine.connect() as conn:
        return bool((await event_store.read_backlog(conn, run_id, seq, 1)).rows)


async def client_tool_outputs(
    engine: AsyncEngine, tenant_id: str, run_id: str
) -> dict[str, tuple[Any, bool]]:
    """The outputs the client sent for the run's client-side tool calls, by call id (each
    with whether it is an error), from the journal."""
    run = await runs.get_run(engine, tenant_id, run_id)
    async with engine.connect() as conn:
        entries = await journal_db.run_entries(
            conn, run.session_id, run.input_seq, run_id, tenant_id=tenant_id
        )
    return {
        e.refs["tool_call_id"]: (e.payload.get("content"), bool(e.payload.get("is_error")))
        for e in entries
        if e.kind == EntryKind.TOOL_RESULT and "tool_call_id" in e.refs
    }
