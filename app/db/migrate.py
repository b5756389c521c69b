"""Alembic, driven from code: upgrade to head and tell whether a database is at head."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.exc import ProgrammingError
from sqlalchemy.ext.asyncio import AsyncConnection

from app.credentials import Vault


def _migrations_dir() -> Path:
    """The alembic scripts: beside this module in an installed wheel (the build maps the
    checkout's top-level migrations/ there: pyproject.toml), else at the checkout's top."""
    here = Path(__file__).resolve().parent
    packaged = here / "migrations"
    return packaged if packaged.is_dir() else here.parents[1] / "migrations"


MIGRATIONS_DIR = _migrations_dir()


def alembic_config(database_url: str | None = None, vault: Vault | None = None) -> Config:
    """`vault`: the keys of the caller's settings, for migrations that encrypt stored secrets."""
    cfg = Config()
    cfg.attributes["vault"] = vault
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    if database_url:
        cfg.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return cfg


@dataclass(frozen=True)
class Upgrade:
    applied: int  # migrations applied by this upgrade
    revision: str | None  # the database's revision now (head)

    def describe(self) -> str:
        """One line for a person: a first start applies every migration, later ones none."""
        if self.applied:
            plural = "s" if self.applied != 1 else ""
            return f"migrated to {self.revision} ({self.applied} migration{plural} applied)"
        return f"database at {self.revision}: no migration to apply"


def upgrade_to_head(database_url: str, vault: Vault | None = None) -> Upgrade:
    """Apply every pending migration. Call outside a running event loop (env.py runs its own).

    Alembic's line per migration (and its two about the dialect) are counted, not logged: a
    first start wrote 19 of them; the caller reports the outcome in one (Upgrade.describe)."""
    with _alembic_lines() as lines:
        command.upgrade(alembic_config(database_url, vault), "head")
    applied = sum(1 for line in lines if line.startswith("Running upgrade"))
    return Upgrade(applied, head_revision())


@contextmanager
def _alembic_lines() -> Iterator[list[str]]:
    """Alembic's info lines while the block runs, kept out of the log (warnings still go)."""
    logger = logging.getLogger("alembic.runtime.migration")
    lines: list[str] = []

    def keep(record: logging.LogRecord) -> bool:
        if record.levelno > logging.INFO:
            return True
        lines.append(record.getMessage())
        return False

    saved = logger.level
    logger.setLevel(logging.INFO)  # the lines are counted whatever the log level
    logger.addFilter(keep)
    try:
        yield lines
    finally:
        logger.removeFilter(keep)
        logger.setLevel(saved)


@cache
def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


async def current_revision(conn: AsyncConnection) -> str | None:
    try:
        return (await conn.execute(text("SELECT version_num FROM alembic_version"))).scalar()
    except ProgrammingError:  # no alembic_version table: never migrated
        return None
