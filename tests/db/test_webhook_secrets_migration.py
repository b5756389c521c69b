"""The migration that encrypts webhook signing secrets encrypts the ones stored in clear before
it, with the caller's keys, and its downgrade gives them back."""

from __future__ import annotations

import asyncio

import asyncpg
from alembic import command
from alembic.script import ScriptDirectory
from cryptography.fernet import Fernet

from app.credentials import Vault
from app.db.engine import libpq_url
from app.db.migrate import alembic_config
from testkit.database import create_database

REVISION = "e6a4c2d8f731"
PLAIN = "whsec_" + "A" * 43 + "="


def test_secrets_stored_in_clear_are_encrypted_and_the_downgrade_decrypts_them(
    database_url: str,
) -> None:
    url = create_database(database_url, "webhook-secrets", migrate=False)
    vault = Vault([Fernet.generate_key().decode()])
    config = alembic_config(url, vault)
    before = ScriptDirectory.from_config(config).get_revision(REVISION).down_revision
    assert isinstance(before, str)
    command.upgrade(config, before)

    async def sql(statement: str, *args: object) -> list[asyncpg.Record]:
        conn = await asyncpg.connect(libpq_url(url))
        try:
            return list(await conn.fetch(statement, *args))
        finally:
            await conn.close()

    tenant = asyncio.run(sql("INSERT INTO tenants (name) VALUES ('t') RETURNING id"))[0]["id"]
    asyncio.run(
        sql(
            "INSERT INTO webhook_endpoints (tenant_id, url, secret) VALUES ($1, $2, $3)",
            tenant,
            "https://hooks.example.com/a",
            PLAIN,
        )
    )

    command.upgrade(config, REVISION)
    (row,) = asyncio.run(sql("SELECT encrypted_secret FROM webhook_endpoints"))
    assert row["encrypted_secret"] != PLAIN and "whsec_" not in row["encrypted_secret"]
    assert vault.decrypt(row["encrypted_secret"]) == PLAIN

    command.upgrade(config, REVISION)  # at the revision already: nothing encrypted twice
    assert vault.decrypt(asyncio.run(sql("SELECT encrypted_secret FROM webhook_endpoints"))[0][0])

    command.downgrade(config, before)
    (row,) = asyncio.run(sql("SELECT secret FROM webhook_endpoints"))
    assert row["secret"] == PLAIN
    command.upgrade(config, "head")
