"""Compaction jobs are runs of their own kind.

Revision ID: a7b2c0de0007
Revises: f6a1c0de0006
Create Date: 2026-11-22 06:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "a7b2c0de0007"
down_revision: str | None = "f6a1c0de0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "runs", sa.Column("kind", sa.Text(), nullable=False, server_default=sa.text("'ask'"))
    )
    op.create_check_constraint("runs_kind", "runs", "kind IN ('ask', 'compaction')")


def downgrade() -> None:
    op.drop_constraint("runs_kind", "runs")
    op.drop_column("runs", "kind")
