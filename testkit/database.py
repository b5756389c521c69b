"""A new database in a running cluster, for tests and benchmarks that need one of their own."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg

from app.db.engine import libpq_url
from app.db.migrate import upgrade_to_head


def create_database(database_url: str, prefix: str, *, migrate: bool = True) -> str:
    """A new database beside `database_url`'s, migrated unless told not to; returns its URL."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"

    async def create() -> None:
        conn = await asyncpg.connect(libpq_url(database_url))
        try:
            await conn.execute(f'CREATE DATABASE "{name}"')
        finally:
            await conn.close()

    asyncio.run(create())
    base, _, query = database_url.partition("?")
    url = f"{base.rsplit('/', 1)[0]}/{name}" + (f"?{query}" if query else "")
    if migrate:
        upgrade_to_head(url)
    return url


def drop_database(database_url: str, url: str) -> None:
    """Drop the database at `url` (made by create_database beside `database_url`), ending any
    connection still open to it."""
    name = url.partition("?")[0].rsplit("/", 1)[1]

    async def drop() -> None:
        conn = await asyncpg.connect(libpq_url(database_url))
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await conn.close()

    asyncio.run(drop())
