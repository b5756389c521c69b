"""Runs remember that retention pruned their events (and their finished jobs).

Without it each retention pass (every minute by default) looked at every run that ever ended:
its cost grew with the service's whole history. A partial index holds the runs still due.

Revision ID: a7c3e5f9b214
Revises: f2b8e7a1c012
Create Date: 2026-11-26 01:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "a7c3e5f9b214"
down_revision: str | None = "f2b8e7a1c012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A constant default: Postgres adds the column without rewriting the table.
    op.add_column(
        "runs",
        sa.Column("events_pruned", sa.Boolean(), nullable=False, server_default=sa.false()),
    )
    op.create_index(
        "runs_ended_unpruned",
        "runs",
        ["ended_at"],
        postgresql_where=sa.text("ended_at IS NOT NULL AND NOT events_pruned"),
    )


def downgrade() -> None:
    op.drop_index("runs_ended_unpruned", "runs")
    op.drop_column("runs", "events_pruned")
