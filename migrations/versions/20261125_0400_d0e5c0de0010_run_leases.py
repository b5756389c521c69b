"""Runs name the worker lease of their attempt, and count the workers lost while running them.

A lease is a session-level advisory lock each worker process holds on a connection of its own:
Postgres releases it the moment the process dies, so a run whose lease is gone is taken over
at once, while a slow or paused worker keeps its runs.

Revision ID: d0e5c0de0010
Revises: c9d4c0de0009
Create Date: 2026-11-25 04:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "d0e5c0de0010"
down_revision: str | None = "c9d4c0de0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("lease", sa.BigInteger(), nullable=True))
    op.add_column(
        "runs",
        sa.Column("workers_lost", sa.Integer(), nullable=False, server_default=sa.text("0")),
    )
    # The recovery loop looks at unfinished runs only.
    op.create_index(
        "runs_unfinished",
        "runs",
        ["status"],
        postgresql_where=sa.text("status IN ('queued', 'running')"),
    )


def downgrade() -> None:
    op.drop_index("runs_unfinished", "runs")
    op.drop_column("runs", "workers_lost")
    op.drop_column("runs", "lease")
