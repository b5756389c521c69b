"""The migration that brings daily tenant usage fills it from the runs already recorded."""

from __future__ import annotations

import asyncio

import asyncpg
from alembic import command
from alembic.script import ScriptDirectory

from app.db.engine import libpq_url
from app.db.migrate import alembic_config
from testkit.database import create_database

USAGE_REVISION = "f2b8c0de0012"


def test_usage_is_backfilled_from_ended_runs(database_url: str) -> None:
    url = create_database(database_url, "usage-backfill", migrate=False)
    config = alembic_config(url)
    before = ScriptDirectory.from_config(config).get_revision(USAGE_REVISION).down_revision
    assert isinstance(before, str)
    command.upgrade(config, before)

    async def seed() -> None:
        conn = await asyncpg.connect(libpq_url(url))
        try:
            tenant = await conn.fetchval("INSERT INTO tenants (name) VALUES ('t') RETURNING id")
            session = await conn.fetchval(
                "INSERT INTO sessions (tenant_id) VALUES ($1) RETURNING id", tenant
            )
            rows = [  # model, input, output, cached, cost, ended
                ("openai:a", 10, 2, 1, "0.5", "2026-11-01 23:59:59+00"),
                ("openai:a", 20, 3, 0, "0.25", "2026-11-01 08:00:00+00"),
                ("openai:a", 5, 1, 0, "0.1", "2026-11-02 00:00:01+00"),
                ("compat:b", 7, 7, 0, None, "2026-11-01 12:00:00+00"),
                ("openai:a", 99, 9, 0, "9", None),  # not ended: not counted
            ]
            for model, inp, out, cached, cost, ended in rows:
                await conn.execute(
                    "INSERT INTO runs (tenant_id, session_id, model, status, input_tokens,"
                    " output_tokens, cached_tokens, cost_usd, ended_at)"
                    " VALUES ($1, $2, $3, 'completed', $4, $5, $6, $7::text::numeric,"
                    " $8::text::timestamptz)",
                    tenant,
                    session,
                    model,
                    inp,
                    out,
                    cached,
                    cost,
                    ended,
                )
        finally:
            await conn.close()

    asyncio.run(seed())
    command.upgrade(config, "head")

    async def read() -> list[tuple[str, str, int, int, int, int, str, int]]:
        conn = await asyncpg.connect(libpq_url(url))
        try:
            rows = await conn.fetch(
                "SELECT day::text, model, runs, input_tokens, output_tokens, cached_tokens,"
                " cost_usd::text, unpriced_runs FROM tenant_usage ORDER BY day, model"
            )
            return [tuple(r) for r in rows]
        finally:
            await conn.close()

    assert asyncio.run(read()) == [
        ("2026-11-01", "compat:b", 1, 7, 7, 0, "0.0000000000", 1),
        ("2026-11-01", "openai:a", 2, 30, 5, 1, "0.7500000000", 0),
        ("2026-11-02", "openai:a", 1, 5, 1, 0, "0.1000000000", 0),
    ]
