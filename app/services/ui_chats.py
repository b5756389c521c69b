"""AI SDK chats as sessions: a chat id names a session, a regenerate is a rollback and an ask.

The frontend (`useChat`) keeps its own copy of the conversation and sends all of it; the
session's journal stays the source of truth, so only the newest user message is taken from it.
"""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import RowMapping
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from app.core.entries import EntryKind
from app.db import runs as runs_db
from app.db import sessions as sessions_db
from app.services import journal
from app.services.errors import Conflict, Invalid

# Sessions made for chats get ids derived from this namespace, the tenant and the chat id.
CHAT_NAMESPACE = uuid.UUID("6f1c2a0e-5b7d-4c3e-9a8f-1d2e3f4a5b6c")
CHAT_ID_KEY = "ai_sdk_chat_id"  # the metadata key holding the chat id of such a session
MAX_CHAT_ID_LENGTH = 512
HISTORY_PAGE = 100


def derived_session_id(tenant_id: str, chat_id: str) -> str:
    return str(uuid.uuid5(CHAT_NAMESPACE, f"{tenant_id}/{chat_id}"))


async def find_session(engine: AsyncEngine, tenant_id: str, chat_id: str) -> RowMapping | None:
    """The chat's session: the session whose id the chat id is, else the one made for it."""
    async with engine.connect() as conn:
        if _is_uuid(chat_id):
            own = await sessions_db.get_session(conn, tenant_id, chat_id)
            if own is not None:
                return own
        return await sessions_db.get_session(
            conn, tenant_id, derived_session_id(tenant_id, chat_id)
        )


async def chat_session(engine: AsyncEngine, tenant_id: str, chat_id: str) -> RowMapping:
    """The chat's session, made on the chat's first message (with the default config)."""
    found = await find_session(engine, tenant_id, chat_id)
    if found is not None:
        return found
    session_id = derived_session_id(tenant_id, chat_id)
    try:
        async with engine.begin() as conn:
            return await sessions_db.insert_session(
                conn,
                id=session_id,
                tenant_id=tenant_id,
                title=None,
                metadata={CHAT_ID_KEY: chat_id},
                config={},
            )
    except IntegrityError:  # a concurrent first message made it
        again = await find_session(engine, tenant_id, chat_id)
        if again is None:
            raise
        return again


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


def new_user_text(messages: list[dict[str, Any]]) -> str:
    """The text of the last message, which must be the user's: the one to journal."""
    if not messages or messages[-1].get("role") != "user":
        raise Invalid(
            "no_user_message",
            "the last message must be the user's new message",
            {"loc": ["body", "messages", len(messages) - 1]},
        )
    parts = messages[-1].get("parts")
    texts = [
        p["text"]
        for p in parts or []
        if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
    ]
    if not "".join(texts).strip():
        raise Invalid(
            "empty_message",
            "the user's message has no text part",
            {"loc": ["body", "messages", len(messages) - 1, "parts"]},
        )
    return "\n\n".join(texts)


async def roll_back_last_answer(
    engine: AsyncEngine, tenant_id: str, session_id: str
) -> str | list[dict[str, Any]]:
    """Take the last user message and all after it (the answer to regenerate) out of the
    session's context; returns that message's content, to ask again."""
    async with engine.connect() as conn:
        active = await runs_db.active_runs(conn, session_id, kind="ask")
    if active:
        raise Conflict(
            "session_busy",
            "the chat has a run in progress; stop it before regenerating",
            {"active_run_id": active[-1].id},
        )
    before: int | None = None
    while True:
        page = await journal.read_history(
            engine,
            tenant_id,
            session_id,
            after_seq=None,
            before_seq=before,
            limit=HISTORY_PAGE,
            kinds=[str(EntryKind.MESSAGE)],
            order="desc",
        )
        for entry in page.entries:
            if entry["payload"].get("role") == "user":
                content: str | list[dict[str, Any]] = entry["payload"]["content"]
                rollback = journal.NewEntry(
                    EntryKind.ROLLBACK,
                    {"from_seq": entry["seq"], "to_seq": page.rev, "reason": "regenerate"},
                    {},
                )
                # expected_rev: an entry appended meanwhile would not be the answer to void.
                await journal.append_entries(
                    engine, tenant_id, session_id, [rollback], expected_rev=page.rev
                )
                return content
        if not page.has_more:
            raise Invalid("nothing_to_regenerate", "the chat has no user message yet", {})
        before = page.entries[-1]["seq"]
