"""Client-side tools: when a run waiting for tool outputs expires.

Revision ID: d4a1c0de0004
Revises: c3f1c0de0003
Create Date: 2026-11-22 03:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "d4a1c0de0004"
down_revision: str | None = "c3f1c0de0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("action_expires_at", sa.DateTime(timezone=True)))
    op.execute(
        "CREATE INDEX runs_action_expiry ON runs (action_expires_at)"
        " WHERE status = 'requires_action'"
    )


def downgrade() -> None:
    op.drop_index("runs_action_expiry", table_name="runs")
    op.drop_column("runs", "action_expires_at")
