"""Session expiry (a per-tenant default TTL) and completion webhooks with their delivery log.

Revision ID: f2b8e7a1c012
Revises: f2b8c0de0012
Create Date: 2026-11-25 06:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB, UUID

revision: str = "f2b8e7a1c012"
down_revision: str | None = "f2b8c0de0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("sessions", sa.Column("expires_at", sa.DateTime(timezone=True)))
    op.create_index(
        "sessions_expiring",
        "sessions",
        ["expires_at"],
        postgresql_where=sa.text("expires_at IS NOT NULL"),
    )
    op.add_column("tenants", sa.Column("session_ttl_seconds", sa.BigInteger()))
    op.create_check_constraint("tenants_session_ttl_positive", "tenants", "session_ttl_seconds > 0")
    op.create_table(
        "webhook_endpoints",
        sa.Column(
            "id", UUID(as_uuid=False), primary_key=True, server_default=sa.text("gen_random_uuid()")
        ),
        sa.Column(
            "tenant_id",
            UUID(as_uuid=False),
            sa.ForeignKey("tenants.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column(
            "session_id", UUID(as_uuid=False), sa.ForeignKey("sessions.id", ondelete="CASCADE")
        ),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("secret", sa.Text(), nullable=False),
        sa.Column("event_types", JSONB()),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
    )
    op.create_index("ix_webhook_endpoints_tenant_id", "webhook_endpoints", ["tenant_id"])
    op.create_index(
        "webhook_endpoints_session",
        "webhook_endpoints",
        ["session_id"],
        postgresql_where=sa.text("session_id IS NOT NULL"),
    )
    op.create_table(
        "webhook_deliveries",
        sa.Column(
            "id", UUID(as_uuid=False), primary_key=True, server_default=sa.text("gen_random_uuid()")
        ),
        sa.Column(
            "endpoint_id",
            UUID(as_uuid=False),
            sa.ForeignKey("webhook_endpoints.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column(
            "run_id",
            UUID(as_uuid=False),
            sa.ForeignKey("runs.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("event_type", sa.Text(), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("status", sa.Text(), nullable=False, server_default=sa.text("'pending'")),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("last_status_code", sa.Integer()),
        sa.Column("last_error", sa.Text()),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column("last_attempt_at", sa.DateTime(timezone=True)),
        sa.Column("delivered_at", sa.DateTime(timezone=True)),
        sa.CheckConstraint(
            "status IN ('pending', 'delivered', 'failed')", name="webhook_deliveries_status"
        ),
    )
    op.create_index(
        "webhook_deliveries_endpoint",
        "webhook_deliveries",
        ["endpoint_id", sa.text("created_at DESC"), sa.text("id DESC")],
    )
    op.create_index("ix_webhook_deliveries_run_id", "webhook_deliveries", ["run_id"])
    # Deleting a session deletes its runs' jobs (and their deliveries'), found by their args.
    for key in ("run_id", "delivery_id"):
        op.execute(
            f"CREATE INDEX procrastinate_jobs_{key} ON procrastinate_jobs ((args->>'{key}'))"
            f" WHERE args ? '{key}'"
        )


def downgrade() -> None:
    op.execute("DROP INDEX IF EXISTS procrastinate_jobs_run_id")
    op.execute("DROP INDEX IF EXISTS procrastinate_jobs_delivery_id")
    op.drop_table("webhook_deliveries")
    op.drop_table("webhook_endpoints")
    op.drop_constraint("tenants_session_ttl_positive", "tenants")
    op.drop_column("tenants", "session_ttl_seconds")
    op.drop_index("sessions_expiring", "sessions")
    op.drop_column("sessions", "expires_at")
