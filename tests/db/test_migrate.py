"""Migrations: processes that start together on a fresh database (API replicas, workers,
`threadline migrate`) all bring it to head; migrations take the direct URL."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import asyncpg
import pytest
from alembic.config import Config
from alembic.script import ScriptDirectory

from app.db.engine import libpq_url
from app.db.migrate import MIGRATIONS_DIR, head_revision
from tests.e2e import THREADLINE, create_database

pytestmark = pytest.mark.slow


def migrate_env(**variables: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("THREADLINE_")}
    return env | {f"THREADLINE_{k.upper()}": v for k, v in variables.items()}


def revision(database_url: str) -> str | None:
    async def read() -> str | None:
        conn = await asyncpg.connect(libpq_url(database_url))
        try:
            return await conn.fetchval("SELECT version_num FROM alembic_version")  # type: ignore[no-any-return]
        finally:
            await conn.close()

    return asyncio.run(read())


def test_migrations_started_together_on_a_fresh_database_all_succeed(database_url: str) -> None:
    # Each used to create the same tables and types: all but one failed on duplicates.
    url = create_database(database_url, "migrate", migrate=False)
    env = migrate_env(database_url=url)
    processes = [
        subprocess.Popen(
            [THREADLINE, "migrate"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for _ in range(4)
    ]
    results = [(p.communicate(timeout=300), p.returncode) for p in processes]
    head = head_revision()
    applied = []
    for (out, err), code in results:
        assert code == 0, err.decode()[-3000:]
        # One line each, whoever applied them; alembic's line per migration is not shown.
        said = out.decode().strip()
        if said.startswith("migrated"):
            assert said.startswith(f"migrated to {head} (") and said.endswith(" applied)")
            applied.append(said)
        else:
            assert said == f"database at {head}: no migration to apply"
        assert "Running upgrade" not in err.decode()
    assert applied  # at least one process applied them (the others may have waited for it)
    assert revision(url) == head


def test_migrate_connects_directly_when_a_direct_url_is_set(database_url: str) -> None:
    # Behind a transaction pooler, the pooled URL (here: nothing listens on it) is not used.
    url = create_database(database_url, "migrate", migrate=False)
    unreachable = "postgresql://postgres@127.0.0.1:1/nowhere"
    env = migrate_env(database_url=unreachable, direct_database_url=url)
    done = subprocess.run([THREADLINE, "migrate"], env=env, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    assert revision(url) == head_revision()


def test_the_alembic_cli_config_names_the_migrations_the_service_runs() -> None:
    """alembic.ini (for `alembic revision` and the like, from the checkout) and app.db.migrate
    (the service, a wheel) find the same scripts: the top-level migrations/ of the checkout."""
    config = Config(str(Path(__file__).resolve().parents[2] / "alembic.ini"))
    location = Path(config.get_main_option("script_location") or "")
    assert location.resolve() == MIGRATIONS_DIR.resolve()
    assert ScriptDirectory.from_config(config).get_current_head() == head_revision()
