"""Runs say whether their usage was reported by the provider or estimated by us.

Revision ID: b8c3c0de0008
Revises: ab10f1e50008
Create Date: 2026-11-25 02:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "b8c3c0de0008"
down_revision: str | None = "ab10f1e50008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "runs",
        sa.Column("usage_estimated", sa.Boolean(), nullable=False, server_default=sa.false()),
    )


def downgrade() -> None:
    op.drop_column("runs", "usage_estimated")
