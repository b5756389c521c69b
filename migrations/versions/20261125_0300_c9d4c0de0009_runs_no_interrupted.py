"""Runs are never `interrupted`: no transition led there (a run whose worker died is retried,
a stopped one is `cancelled`), so the status goes from the allowed set.

Revision ID: c9d4c0de0009
Revises: b8c3c0de0008
Create Date: 2026-11-25 03:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "c9d4c0de0009"
down_revision: str | None = "b8c3c0de0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

STATUSES = "'queued','running','requires_action','completed','failed','cancelled'"


def upgrade() -> None:
    op.drop_constraint("runs_status_known", "runs", type_="check")
    op.create_check_constraint("runs_status_known", "runs", f"status IN ({STATUSES})")


def downgrade() -> None:
    op.drop_constraint("runs_status_known", "runs", type_="check")
    op.create_check_constraint(
        "runs_status_known", "runs", f"status IN ({STATUSES}, 'interrupted')"
    )
