"""API keys: issue one for a tenant, and resolve a presented key to its tenant."""

from __future__ import annotations

import hashlib
import secrets

from sqlalchemy.ext.asyncio import AsyncEngine

from app.db import tenants as tenants_db
from app.db.engine import autocommit

KEY_PREFIX = "tl_"


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


async def create_key(engine: AsyncEngine, tenant_name: str, name: str | None = None) -> str:
    """A new key for `tenant_name` (the tenant is created on first use); only its hash is kept."""
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    async with engine.begin() as conn:
        tenant_id = await tenants_db.ensure_tenant(conn, tenant_name)
        await tenants_db.insert_key(conn, tenant_id, hash_key(key), key[:8], name)
    return key


async def tenant_for_key(engine: AsyncEngine, key: str) -> str | None:
    async with autocommit(engine) as conn:  # every request: one statement, no transaction
        return await tenants_db.tenant_for_key_hash(conn, hash_key(key))


DEV_TENANT = "dev"


async def ensure_dev_key(engine: AsyncEngine, kept: str | None) -> str:
    """The development key: `kept` (the one saved last time) while it is valid, else a new one."""
    if kept and await tenant_for_key(engine, kept) is not None:
        return kept
    return await create_key(engine, DEV_TENANT, name="development key")
