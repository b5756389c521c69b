"""MCP tool servers: a tenant's remote tool servers, their credentials encrypted.

Revision ID: b4d1e2f3a529
Revises: c4e2a1b0f014
Create Date: 2026-11-28 16:35:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "b4d1e2f3a529"
down_revision: str | None = "c4e2a1b0f014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "mcp_servers",
        sa.Column(
            "id",
            postgresql.UUID(as_uuid=False),
            primary_key=True,
            server_default=sa.text("gen_random_uuid()"),
        ),
        sa.Column(
            "tenant_id",
            postgresql.UUID(as_uuid=False),
            sa.ForeignKey("tenants.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column(
            "transport", sa.Text(), nullable=False, server_default=sa.text("'streamable_http'")
        ),
        sa.Column("allowed_tools", postgresql.JSONB()),
        sa.Column("credentials", sa.Text()),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.UniqueConstraint("tenant_id", "name", name="mcp_servers_tenant_name"),
        sa.CheckConstraint("transport IN ('streamable_http', 'sse')", name="mcp_servers_transport"),
    )


def downgrade() -> None:
    op.drop_table("mcp_servers")
