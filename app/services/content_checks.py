"""Content checks at the door that depend on the deployment or the model: the documents' size
cap, and images and PDFs a model cannot read (422, before anything is written)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from app.config import Settings
from app.core.content import DOCUMENT_SIZE, ContentProblem, document_of, is_document
from app.core.entries import EntryKind, NewEntry
from app.core.messages import Content
from app.db import sessions as sessions_db
from app.llm.catalog import reads_images, reads_pdfs
from app.services.errors import Invalid, entries_refused

IMAGES_NOT_SUPPORTED = "images_not_supported"
DOCUMENTS_NOT_SUPPORTED = "documents_not_supported"


def oversized(settings: Settings, content: str | Sequence[Any]) -> list[ContentProblem]:
    """The documents in `content` above the deployment's max_document_bytes."""
    if isinstance(content, str):
        return []
    cap = settings.max_document_bytes
    problems = []
    for at, part in enumerate(content):
        if is_document(part) and (size := document_of(part).size) > cap:
            message = f"the document is {size} bytes, above the limit of {cap} bytes"
            problems.append(ContentProblem((at, "url"), DOCUMENT_SIZE, message))
    return problems


def check_sizes(settings: Settings, contents: Iterable[tuple[tuple[str | int, ...], Any]]) -> None:
    """Refuse (422 invalid_content, rule document_too_large) any oversized document among
    `contents`: (the location of a content, the content)."""
    errors = [p.as_error(*at) for at, content in contents for p in oversized(settings, content)]
    if errors:
        raise entries_refused(errors)


def check_readable(model: str, content: Content | Sequence[Any], loc: list[str | int]) -> None:
    """Refuse (422) an image or a PDF in `content` that `model` cannot read; `loc`: where the
    content was given (the part's index is added)."""
    if isinstance(content, str):
        return
    for at, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "image_url" and not reads_images(model):
            message = f"{model} cannot read images; ask a model that can (e.g. openai:gpt-4o-mini)"
            raise Invalid(IMAGES_NOT_SUPPORTED, message, {"loc": [*loc, at], "model": model})
        pdf = kind == "document" and document_of(part).media_type == "application/pdf"
        if pdf and not reads_pdfs(model):
            message = f"{model} cannot read PDF documents; ask a model that can "
            message += "(e.g. anthropic:claude-haiku-4-5), or send the text as text/plain"
            raise Invalid(DOCUMENTS_NOT_SUPPORTED, message, {"loc": [*loc, at], "model": model})


async def check_appended(
    engine: AsyncEngine,
    settings: Settings,
    tenant_id: str,
    session_id: str,
    entries: Sequence[NewEntry],
) -> None:
    """Entries appended by a client: documents within the cap, and what the session's model
    cannot read refused (a session that does not exist is the append's own 404)."""
    messages = [
        (i, e.payload.get("content") or "")
        for i, e in enumerate(entries)
        if e.kind == EntryKind.MESSAGE and isinstance(e.payload, dict)
    ]
    if not any(isinstance(content, list) for _, content in messages):
        return
    check_sizes(settings, [(("entries", i, "payload", "content"), c) for i, c in messages])
    async with engine.connect() as conn:
        session = await sessions_db.get_session(conn, tenant_id, session_id)
    if session is None:
        return
    model = session.config.model or settings.default_model
    for i, content in messages:
        check_readable(model, content, ["body", "entries", i, "payload", "content"])
