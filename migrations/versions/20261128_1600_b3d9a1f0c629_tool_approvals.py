"""Tool calls that wait for a person's approval: one row per call, answered once, run once;
and the run status that waits for them (awaiting_approval).

Revision ID: b3d9a1f0c629
Revises: c4d9e2a7b518
Create Date: 2026-11-28 16:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "b3d9a1f0c629"
down_revision: str | None = "c4d9e2a7b518"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

STATUSES = "'queued', 'running', 'requires_action', 'completed', 'failed', 'cancelled'"


def upgrade() -> None:
    op.drop_constraint("runs_status_known", "runs", type_="check")
    op.create_check_constraint(
        "runs_status_known", "runs", f"status IN ({STATUSES}, 'awaiting_approval')"
    )
    op.create_table(
        "tool_approvals",
        sa.Column(
            "run_id",
            postgresql.UUID(as_uuid=False),
            sa.ForeignKey("runs.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("tool_call_id", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("arguments", postgresql.JSONB(), nullable=False),
        sa.Column("decision", sa.Text()),
        sa.Column("edited_arguments", postgresql.JSONB()),
        sa.Column("reason", sa.Text()),
        sa.Column(
            "requested_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column("decided_at", sa.DateTime(timezone=True)),
        sa.Column("executed_at", sa.DateTime(timezone=True)),
        sa.PrimaryKeyConstraint("run_id", "tool_call_id", name="tool_approvals_pkey"),
        sa.CheckConstraint(
            "decision IN ('approved', 'rejected', 'expired')", name="tool_approvals_decision"
        ),
        sa.CheckConstraint(
            "executed_at IS NULL OR decision = 'approved'",
            name="tool_approvals_executed_approved",
        ),
    )


def downgrade() -> None:
    op.drop_table("tool_approvals")
    op.execute(
        "UPDATE runs SET status = 'failed', ended_at = now() WHERE status = 'awaiting_approval'"
    )
    op.drop_constraint("runs_status_known", "runs", type_="check")
    op.create_check_constraint("runs_status_known", "runs", f"status IN ({STATUSES})")
