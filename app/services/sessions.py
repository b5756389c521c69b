"""Session use cases: create, read, list, update, delete (keeping forks whole), fork."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.config import Settings
from app.core.agents import AgentPin, resolved
from app.core.lineage import fork_lineage, inherited_range, is_direct_heir, lineage_to_json, without
from app.core.metadata import MetadataError, merge_patch
from app.core.sessions import Session
from app.db import jobs as jobs_db
from app.db import journal as journal_db
from app.db import sessions as sessions_db
from app.db.engine import autocommit
from app.llm.base import ProviderError
from app.llm.router import Router
from app.services import quotas
from app.services import reasoning as reasonings
from app.services.cursors import decode_cursor, encode_cursor
from app.services.errors import Conflict, Invalid, session_not_found

# A fork retries when a session in its lineage is deleted under it (the lineage is then rewritten).
_FORK_ATTEMPTS = 5
# The config fields naming a model: each must name a provider these settings configure.
MODEL_FIELDS = ("model", "fallback_model", "summarization_model")


@dataclass(frozen=True)
class SessionPage:
    items: list[Session]
    next_cursor: str | None


async def create_session(
    engine: AsyncEngine,
    tenant_id: str,
    *,
    title: str | None,
    metadata: dict[str, str],
    config: dict[str, Any],
    settings: Settings | None = None,
    ttl_seconds: int | None = None,
    expires_at: datetime | None = None,
    agent: AgentPin | None = None,
) -> Session:
    """With `settings`, the config's models must name configured providers (else 422) and the
    tenant's session limit holds (else 429). The session expires at `expires_at`, or
    `ttl_seconds` from now, else after the tenant's default TTL (if it has one). With `agent`,
    it is pinned to that agent version, `config` its own fields over the version's."""
    if settings is not None:
        effective = resolved(agent.config, config) if agent is not None else config
        check_config(settings, effective)
    async with engine.begin() as conn:
        if settings is not None:
            await quotas.check_new_session(conn, settings, tenant_id)
        return await sessions_db.insert_session(
            conn,
            tenant_id=tenant_id,
            title=title,
            metadata=metadata,
            config=config,
            **pinned(agent),
            expires_at=_expiry(tenant_id, ttl_seconds, expires_at),
        )


def _expiry(tenant_id: str, ttl_seconds: int | None, expires_at: datetime | None) -> Any:
    if expires_at is not None:
        return expires_at
    if ttl_seconds is not None:
        return sessions_db.ttl_expiry(ttl_seconds)
    return sessions_db.tenant_default_expiry(tenant_id)


async def get_session(engine: AsyncEngine, tenant_id: str, session_id: str) -> Session:
    async with autocommit(engine) as conn:  # one statement: no BEGIN and ROLLBACK around it
        session = await sessions_db.get_session(conn, tenant_id, session_id)
    if session is None:
        raise session_not_found(session_id)
    return session


async def list_sessions(
    engine: AsyncEngine,
    tenant_id: str,
    *,
    limit: int,
    cursor: str | None,
    metadata: dict[str, str],
    title_contains: str | None = None,
    parent_id: str | None = None,
) -> SessionPage:
    before = decode_cursor(cursor) if cursor else None
    async with engine.connect() as conn:
        items = await sessions_db.list_sessions(
            conn,
            tenant_id,
            limit=limit + 1,
            before=before,
            metadata=metadata,
            title_contains=title_contains,
            parent_id=parent_id,
        )
    more = len(items) > limit
    items = items[:limit]
    next_cursor = encode_cursor(items[-1].created_at, items[-1].id) if more else None
    return SessionPage(items, next_cursor)


async def update_session(
    engine: AsyncEngine,
    tenant_id: str,
    session_id: str,
    changes: dict[str, Any],
    settings: Settings | None = None,
) -> Session:
    """Apply a patch: `title` replaces, `metadata` and `config` merge (a null removes a key).

    With `settings`, models the patch sets must name configured providers (else 422).
    """
    if settings is not None:
        check_models(settings, changes.get("config") or {})
    async with engine.begin() as conn:
        session = await sessions_db.get_session(conn, tenant_id, session_id, lock=True)
        if session is None:
            raise session_not_found(session_id)
        values: dict[str, Any] = {}
        if "title" in changes:
            values["title"] = changes["title"]
        if "metadata" in changes:
            try:
                values["metadata"] = merge_patch(session.metadata, changes["metadata"])
            except MetadataError as exc:
                raise Invalid("invalid_metadata", str(exc), {"loc": ["body", "metadata"]}) from exc
        if "config" in changes:
            config = session.given_config.as_json()
            for key, value in changes["config"].items():
                if value is None:
                    config.pop(key, None)
                else:
                    config[key] = value
            values["config"] = config
            if settings is not None:
                check_reasoning(settings, config)
        if changes.get("ttl_seconds") is not None:
            values["expires_at"] = sessions_db.ttl_expiry(int(changes["ttl_seconds"]))
        elif "expires_at" in changes:  # null: never expires
            values["expires_at"] = changes["expires_at"]
        return await sessions_db.update_session(conn, session_id, values)


async def delete_session(engine: AsyncEngine, tenant_id: str, session_id: str) -> None:
    """Delete a session and every entry stored under it, without breaking its forks.

    The rule: before the entries go, each fork that read a range of them directly gets its own
    copy of that range (same seqs, ids and timestamps), and every descendant's lineage drops the
    deleted session. Deeper descendants then read the range through that fork. Delete is O(shared
    prefix); fork and read stay O(1).
    """
    async with engine.begin() as conn:
        if await sessions_db.get_session(conn, tenant_id, session_id, lock=True) is None:
            raise session_not_found(session_id)
        await delete_locked(conn, session_id)


async def delete_locked(conn: AsyncConnection, session_id: str) -> None:
    """Delete a session whose row the caller locked, with everything stored under it (entries,
    runs and their events, webhook deliveries and endpoints, its runs' finished jobs), first
    giving its forks their shared prefix: DELETE and the retention purge both end here."""
    for reader_id, lineage in await sessions_db.sessions_reading_from(conn, session_id):
        if is_direct_heir(lineage, session_id):
            shared = inherited_range(lineage, session_id)
            assert shared is not None
            await journal_db.copy_range(conn, session_id, reader_id, *shared)
        await sessions_db.set_lineage(conn, reader_id, without(lineage, session_id))
    await jobs_db.delete_jobs_of_runs(conn, await sessions_db.run_ids(conn, session_id))
    await sessions_db.delete_session(conn, session_id)


async def fork_session(
    engine: AsyncEngine,
    tenant_id: str,
    session_id: str,
    *,
    at_seq: int | None,
    title: str | None,
    metadata: dict[str, str] | None,
    settings: Settings | None = None,
) -> Session:
    """A child sharing the parent's thread up to `at_seq` (default: its rev); no entry is copied.
    With `settings`, the tenant's session limit holds (else 429)."""
    async with engine.begin() as conn:
        return await fork_in(
            conn,
            tenant_id,
            session_id,
            at_seq=at_seq,
            title=title,
            metadata=metadata,
            settings=settings,
        )


async def fork_in(
    conn: AsyncConnection,
    tenant_id: str,
    session_id: str,
    *,
    at_seq: int | None,
    title: str | None,
    metadata: dict[str, str] | None,
    settings: Settings | None = None,
    fork_id: str | None = None,
) -> Session:
    """fork_session in the caller's transaction (an ask that answers in a new fork commits
    the fork with it); `fork_id`: the child's id (else a new one)."""
    for _ in range(_FORK_ATTEMPTS):
        try:
            async with conn.begin_nested():
                forked = await _fork_once(
                    conn, tenant_id, session_id, at_seq, title, metadata, settings, fork_id
                )
        except IntegrityError:
            continue  # the parent was deleted between our read and the insert
        if forked is not None:
            return forked
    raise Conflict(
        "fork_conflict",
        "the session's lineage kept changing while forking; retry",
        {"session_id": session_id},
    )


async def _fork_once(
    conn: AsyncConnection,
    tenant_id: str,
    session_id: str,
    at_seq: int | None,
    title: str | None,
    metadata: dict[str, str] | None,
    settings: Settings | None,
    fork_id: str | None,
) -> Session | None:
    """The fork, or None when a session of its lineage was deleted under it (try again)."""
    parent = await sessions_db.get_session(conn, tenant_id, session_id)
    if parent is None:
        raise session_not_found(session_id)
    fork_seq = parent.rev if at_seq is None else at_seq
    if fork_seq > parent.rev:
        raise Invalid(
            "fork_seq_out_of_range",
            f"at_seq {fork_seq} is beyond the session's rev {parent.rev}",
            {"at_seq": fork_seq, "rev": parent.rev},
        )
    lineage = fork_lineage(session_id, parent.lineage, fork_seq)
    # Hold every session the child will read from, so none is deleted (and its range moved)
    # before the child is committed; a deletion that won the race shows up as a missing row,
    # and the fork starts over from the new lineage. Entries up to the parent's rev are
    # committed and immutable: no parent lock.
    readable = [a.session_id for a in lineage]
    if await sessions_db.lock_existing(conn, readable) != len(readable):
        return None
    if settings is not None:
        await quotas.check_new_session(conn, settings, tenant_id)
    return await sessions_db.insert_session(
        conn,
        **({"id": fork_id} if fork_id is not None else {}),
        tenant_id=tenant_id,
        title=parent.title if title is None else title,
        metadata=parent.metadata if metadata is None else metadata,
        config=parent.given_config.as_json(),
        **pinned(parent.agent),
        parent_id=session_id,
        fork_seq=fork_seq,
        lineage=lineage_to_json(lineage),
        rev=fork_seq,
        # A fork is a new session: the tenant's default, not its parent's expiry.
        expires_at=sessions_db.tenant_default_expiry(tenant_id),
    )


def check_config(settings: Settings, config: dict[str, Any]) -> None:
    """Refuse (422) a new session's config these settings cannot serve: its models, its
    reasoning."""
    check_models(settings, config)
    check_reasoning(settings, config)


def check_reasoning(settings: Settings, config: dict[str, Any]) -> None:
    """Refuse a config whose reasoning its model cannot do (422, nothing written)."""
    model = str(config.get("model") or settings.default_model)
    where = ["body", "config", "reasoning"]
    reasonings.check(settings, model, config.get("reasoning"), None, where)


def check_models(settings: Settings, config: dict[str, Any]) -> None:
    """Refuse a config naming a model no configured provider serves: a session whose asks could
    only fail. The 422 names the providers that are configured."""
    router = Router(settings)  # only resolves model strings here: no provider is built
    for name in MODEL_FIELDS:
        model = config.get(name)
        if model is None:
            continue
        try:
            router.route(str(model))
        except ProviderError as error:
            configured = router.configured_providers()
            raise Invalid(
                "provider_not_configured",
                f"{error.message}; configured providers: {', '.join(configured)}",
                {"loc": ["body", "config", name], "model": model, "configured": configured},
            ) from error


def pinned(agent: AgentPin | None) -> dict[str, Any]:
    """A session row's agent columns: the version it is pinned to, with that version's config."""
    if agent is None:
        return {}
    return {
        "agent_id": agent.id,
        "agent_name": agent.name,
        "agent_version": agent.version,
        "agent_config": dict(agent.config),
    }
