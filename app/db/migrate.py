"""Alembic, driven from code: upgrade to head and tell whether a database is at head."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.exc import ProgrammingError
from sqlalchemy.ext.asyncio import AsyncConnection


def _migrations_dir() -> Path:
    """The alembic scripts: beside this module in an installed wheel (the build maps the
    checkout's top-level migrations/ there: pyproject.toml), else at the checkout's top."""
    here = Path(__file__).resolve().parent
    packaged = here / "migrations"
    return packaged if packaged.is_dir() else here.parents[1] / "migrations"


MIGRATIONS_DIR = _migrations_dir()


def alembic_config(database_url: str | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    if database_url:
        cfg.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return cfg


def upgrade_to_head(database_url: str) -> None:
    """Apply every pending migration. Call outside a running event loop (env.py runs its own)."""
    command.upgrade(alembic_config(database_url), "head")


@cache
def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


async def current_revision(conn: AsyncConnection) -> str | None:
    try:
        return (await conn.execute(text("SELECT version_num FROM alembic_version"))).scalar()
    except ProgrammingError:  # no alembic_version table: never migrated
        return None
