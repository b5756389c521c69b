"""API keys: issue, list, revoke and rotate a tenant's keys, and resolve a presented key.

A key is looked up in the database on every request (one statement, no cache): a revoked key
is refused at once by every API process.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import RowMapping
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db import tenants as tenants_db
from app.db.engine import autocommit
from app.db.tables import LIMIT_COLUMNS
from app.services.errors import Invalid, NotFound
from app.services.ids import is_uuid
from app.services.key_cache import KeyCache, KnownKey
from app.services.quotas import Limits, tenant_named

KEY_PREFIX = "tl_"
# Characters of a key shown in listings to tell keys apart (the prefix and 9 random ones).
SHOWN_PREFIX = 12


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True)
class ApiKey:
    """What is known of a key; never the key itself (only its hash is kept)."""

    id: str
    tenant: str
    prefix: str
    name: str | None
    read_only: bool
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None  # in the future: a rotated key's grace period

    @classmethod
    def of(cls, row: RowMapping) -> ApiKey:
        return cls(
            id=str(row["id"]),
            tenant=row["tenant"],
            prefix=row["prefix"],
            name=row["name"],
            read_only=row["read_only"],
            created_at=row["created_at"],
            last_used_at=row["last_used_at"],
            revoked_at=row["revoked_at"],
        )


@dataclass(frozen=True)
class IssuedKey:
    key: str  # shown once
    info: ApiKey


async def issue_key(
    engine: AsyncEngine, tenant_name: str, name: str | None = None, *, read_only: bool = False
) -> IssuedKey:
    """A new key for `tenant_name` (the tenant is created on first use)."""
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    async with engine.begin() as conn:
        tenant_id = await tenants_db.ensure_tenant(conn, tenant_name)
        row = await tenants_db.insert_key(
            conn, tenant_id, hash_key(key), key[:SHOWN_PREFIX], name, read_only
        )
    return IssuedKey(key, ApiKey.of(row))


async def create_key(
    engine: AsyncEngine, tenant_name: str, name: str | None = None, *, read_only: bool = False
) -> str:
    """A new key for `tenant_name` (the tenant is created on first use); only its hash is kept."""
    return (await issue_key(engine, tenant_name, name, read_only=read_only)).key


async def list_keys(engine: AsyncEngine, tenant_name: str | None = None) -> list[ApiKey]:
    async with engine.connect() as conn:
        tenant_id = str((await tenant_named(conn, tenant_name))["id"]) if tenant_name else None
        return [ApiKey.of(r) for r in await tenants_db.list_keys(conn, tenant_id)]


async def find_key(engine: AsyncEngine, ref: str, tenant_name: str | None = None) -> ApiKey:
    """The key `ref` names: its id, its prefix (as listed) or the whole key; within one
    tenant's keys when `tenant_name` is given."""
    async with engine.connect() as conn:
        if is_uuid(ref):
            row = await tenants_db.get_key(conn, ref)
            found = [row] if row is not None else []
        else:
            found = await tenants_db.keys_matching(conn, ref, hash_key(ref))
    if tenant_name is not None:
        found = [r for r in found if r["tenant"] == tenant_name]
    if not found:
        raise NotFound("key_not_found", f"no API key {ref}", {"key": ref})
    if len(found) > 1:
        raise Invalid(
            "ambiguous_key",
            f"{len(found)} keys have the prefix {ref}: name one by its id",
            {"key": ref, "ids": [str(r["id"]) for r in found]},
        )
    return ApiKey.of(found[0])


async def revoke_key(engine: AsyncEngine, key_id: str, *, after_seconds: float = 0) -> ApiKey:
    """Revoke a key now (or after a grace period); every API process refuses it from then on.
    Revoking a revoked key changes nothing (an earlier revocation time stands)."""
    async with engine.begin() as conn:
        if await tenants_db.get_key(conn, key_id, lock=True) is None:
            raise NotFound("key_not_found", f"no API key {key_id}", {"key": key_id})
        return ApiKey.of(await tenants_db.revoke_key(conn, key_id, after_seconds))


async def rotate_key(engine: AsyncEngine, key_id: str, *, grace_seconds: float = 0) -> IssuedKey:
    """A new key with the old one's tenant, name and scope; the old one is revoked now, or
    after `grace_seconds` (for clients to switch). One transaction: never both keys lost."""
    if grace_seconds < 0:
        raise Invalid("invalid_grace", "the grace period cannot be negative", {})
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    async with engine.begin() as conn:
        old = await tenants_db.get_key(conn, key_id, lock=True)
        if old is None:
            raise NotFound("key_not_found", f"no API key {key_id}", {"key": key_id})
        if old["revoked_at"] is not None:
            raise Invalid(
                "key_revoked", "a revoked key cannot be rotated: create a new one", {"id": key_id}
            )
        row = await tenants_db.insert_key(
            conn,
            str(old["tenant_id"]),
            hash_key(key),
            key[:SHOWN_PREFIX],
            old["name"],
            old["read_only"],
        )
        await tenants_db.revoke_key(conn, key_id, grace_seconds)
    return IssuedKey(key, ApiKey.of(row))


@dataclass(frozen=True)
class Caller:
    """Who a request's API key speaks for, and its request count this minute where the
    tenant has a requests-per-minute limit."""

    tenant_id: str
    read_only: bool
    rpm_limit: int | None
    rpm_count: int | None
    window_start: datetime | None
    retry_after: int | None
    limits: Limits  # the tenant's own (None: the server's default), as read with the key

    @property
    def over_rate(self) -> bool:
        return self.rpm_limit is not None and (self.rpm_count or 0) > self.rpm_limit


async def authenticate(
    engine: AsyncEngine, key: str, default_rpm: int | None, cache: KeyCache | None = None
) -> Caller | None:
    """The caller a key speaks for, this request counted; None: unknown or revoked. A key in
    `cache` takes no statement, or one to count the request where the tenant has a limit."""
    key_hash = hash_key(key)
    known = cache.get(key_hash) if cache is not None else None
    if known is not None and known.rpm_limit is None:
        return _caller(known, None)
    async with autocommit(engine) as conn:  # one statement, no transaction
        if known is not None:
            return _caller(known, await tenants_db.count_request(conn, known.tenant_id))
        generation = cache.generation if cache is not None else 0
        row = await tenants_db.authenticate(conn, key_hash, default_rpm)
    if row is None:
        return None
    known = KnownKey(
        tenant_id=str(row["tenant_id"]),
        read_only=row["read_only"],
        rpm_limit=row["rpm"],
        limits=Limits(**{c: row[c] for c in LIMIT_COLUMNS}),
        revoked_at=row["revoked_at"],
        read_at=time.monotonic(),
    )
    if cache is not None:
        cache.put(key_hash, known, generation)
    return _caller(known, row)


def _caller(known: KnownKey, counted: RowMapping | None) -> Caller:
    """`counted`: this request's count in the tenant's minute (None, or a None count: not
    counted)."""
    if counted is None or counted["count"] is None:
        count, window_start, retry_after = None, None, None
    else:
        count, window_start, retry_after = (
            counted["count"],
            counted["window_start"],
            counted["retry_after"],
        )
    return Caller(
        tenant_id=known.tenant_id,
        read_only=known.read_only,
        rpm_limit=known.rpm_limit,
        rpm_count=count,
        window_start=window_start,
        retry_after=retry_after,
        limits=known.limits,
    )


async def tenant_for_key(engine: AsyncEngine, key: str) -> str | None:
    async with autocommit(engine) as conn:
        return await tenants_db.tenant_for_key_hash(conn, hash_key(key))


DEV_TENANT = "dev"


async def ensure_dev_key(engine: AsyncEngine, kept: str | None) -> str:
    """The development key: `kept` (the one saved last time) while it is valid, else a new one."""
    if kept and await tenant_for_key(engine, kept) is not None:
        return kept
    return await create_key(engine, DEV_TENANT, name="development key")
