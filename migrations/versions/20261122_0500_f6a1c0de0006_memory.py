"""Persistent memory: namespaced notes per tenant, versioned for optimistic concurrency.

Revision ID: f6a1c0de0006
Revises: e5b1c0de0005
Create Date: 2026-11-22 05:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import UUID

revision: str = "f6a1c0de0006"
down_revision: str | None = "e5b1c0de0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Keyed by tenant first: every query names the tenant, and lists scan one tenant's range.
    # Not under a session: memory outlives the sessions that name it.
    op.create_table(
        "memories",
        sa.Column(
            "tenant_id",
            UUID(as_uuid=False),
            sa.ForeignKey("tenants.id", ondelete="CASCADE"),
            nullable=False,
        ),
        # Byte order ("C"): list pages follow the primary key whatever the database's locale.
        sa.Column("namespace", sa.Text(collation="C"), nullable=False),
        sa.Column("content", sa.Text, nullable=False),
        # 1 at creation, +1 per write: the ETag is derived from it.
        sa.Column("version", sa.BigInteger, nullable=False, server_default=sa.text("1")),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.PrimaryKeyConstraint("tenant_id", "namespace", name="memories_pkey"),
        sa.CheckConstraint("version > 0", name="memories_version_positive"),
    )


def downgrade() -> None:
    op.drop_table("memories")
