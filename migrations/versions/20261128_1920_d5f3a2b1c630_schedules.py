"""Schedules: cron asks of a tenant, and their firings (one row per due time).

Revision ID: d5f3a2b1c630
Revises: b4d1e2f3a529
Create Date: 2026-11-28 19:20:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "d5f3a2b1c630"
down_revision: str | None = "b4d1e2f3a529"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UUID = postgresql.UUID(as_uuid=False)


def upgrade() -> None:
    op.create_table(
        "schedules",
        sa.Column("id", UUID, primary_key=True, server_default=sa.text("gen_random_uuid()")),
        sa.Column(
            "tenant_id", UUID, sa.ForeignKey("tenants.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("cron", sa.Text(), nullable=False),
        sa.Column("timezone", sa.Text(), nullable=False),
        sa.Column("misfire", sa.Text(), nullable=False),
        sa.Column("busy", sa.Text(), nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("session_id", UUID),
        sa.Column("agent", sa.Text()),
        sa.Column("agent_version", sa.Integer()),
        sa.Column("title_template", sa.Text()),
        sa.Column("ask", postgresql.JSONB(), nullable=False),
        sa.Column("next_due_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.CheckConstraint("misfire IN ('run_once', 'skip')", name="schedules_misfire"),
        sa.CheckConstraint("busy IN ('queue', 'skip')", name="schedules_busy"),
        sa.CheckConstraint("(session_id IS NULL) <> (agent IS NULL)", name="schedules_target"),
    )
    op.create_index("schedules_tenant_created", "schedules", ["tenant_id", "created_at"])
    op.create_index(
        "schedules_due", "schedules", ["next_due_at"], postgresql_where=sa.text("enabled")
    )
    op.create_table(
        "schedule_firings",
        sa.Column("id", UUID, primary_key=True, server_default=sa.text("gen_random_uuid()")),
        sa.Column(
            "schedule_id", UUID, sa.ForeignKey("schedules.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("due_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text()),
        sa.Column("message", sa.Text()),
        sa.Column("session_id", UUID),
        sa.Column("run_id", UUID),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.UniqueConstraint("schedule_id", "due_at", name="schedule_firings_once"),
        sa.CheckConstraint(
            "status IN ('fired', 'skipped', 'failed')", name="schedule_firings_status"
        ),
    )


def downgrade() -> None:
    op.drop_table("schedule_firings")
    op.drop_table("schedules")
