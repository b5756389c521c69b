"""Steers: a user's message sent while a run works, waiting for the run's next model turn.

Revision ID: b3d1f0c0e013
Revises: a7c3e5f9b214
Create Date: 2026-11-28 15:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB, UUID

revision: str = "b3d1f0c0e013"
down_revision: str | None = "a7c3e5f9b214"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "steers",
        sa.Column("id", UUID(as_uuid=False), primary_key=True),
        sa.Column(
            "tenant_id",
            UUID(as_uuid=False),
            sa.ForeignKey("tenants.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column(
            "session_id",
            UUID(as_uuid=False),
            sa.ForeignKey("sessions.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column(
            "run_id",
            UUID(as_uuid=False),
            sa.ForeignKey("runs.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("content", JSONB, nullable=False),
        sa.Column("model", sa.Text, nullable=False),
        sa.Column("params", JSONB, nullable=False),
        sa.Column("status", sa.Text, nullable=False, server_default=sa.text("'pending'")),
        sa.Column("entry_seq", sa.BigInteger),
        sa.Column("next_run_id", UUID(as_uuid=False)),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column("settled_at", sa.DateTime(timezone=True)),
        sa.CheckConstraint(
            "status IN ('pending', 'delivered', 'next_run', 'journaled')", name="steers_status"
        ),
    )
    op.create_index(
        "steers_pending", "steers", ["run_id"], postgresql_where=sa.text("status = 'pending'")
    )


def downgrade() -> None:
    op.drop_table("steers")
