"""Agents: named, versioned configurations that sessions are created from and pinned to.

A session created from an agent keeps a copy of the version's config (versions never change,
so the copy is the version), read with the session's row: no join on the ask path. Moving a
session to another version is journaled as an `agent_version` entry.

Revision ID: c4e2a1b0f014
Revises: b3d9a1f0c629
Create Date: 2026-11-28 16:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB, UUID

revision: str = "c4e2a1b0f014"
down_revision: str | None = "b3d9a1f0c629"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD_KINDS = (
    "'message','tool_call','tool_result','summary','run_start','run_end','usage','error',"
    "'policy_violation','rollback'"
)
KINDS = OLD_KINDS + ",'agent_version'"


def upgrade() -> None:
    op.create_table(
        "agents",
        sa.Column("id", UUID(as_uuid=False), primary_key=True),
        sa.Column(
            "tenant_id",
            UUID(as_uuid=False),
            sa.ForeignKey("tenants.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("latest_version", sa.Integer, nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column("deleted_at", sa.DateTime(timezone=True)),
    )
    # One live agent of a name per tenant; a deleted one's name may be taken again.
    op.create_index(
        "agents_live_name",
        "agents",
        ["tenant_id", "name"],
        unique=True,
        postgresql_where=sa.text("deleted_at IS NULL"),
    )
    op.create_table(
        "agent_versions",
        sa.Column(
            "agent_id",
            UUID(as_uuid=False),
            sa.ForeignKey("agents.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("description", sa.Text),
        sa.Column("config", JSONB, nullable=False),
        sa.Column("metadata", JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.PrimaryKeyConstraint("agent_id", "version", name="agent_versions_pkey"),
        sa.CheckConstraint("version > 0", name="agent_versions_positive"),
    )
    op.add_column("sessions", sa.Column("agent_id", UUID(as_uuid=False)))
    op.add_column("sessions", sa.Column("agent_name", sa.Text))
    op.add_column("sessions", sa.Column("agent_version", sa.Integer))
    op.add_column("sessions", sa.Column("agent_config", JSONB))
    op.drop_constraint("entries_kind_known", "entries", type_="check")
    op.create_check_constraint("entries_kind_known", "entries", f"kind IN ({KINDS})")


def downgrade() -> None:
    op.drop_constraint("entries_kind_known", "entries", type_="check")
    op.create_check_constraint("entries_kind_known", "entries", f"kind IN ({OLD_KINDS})")
    for column in ("agent_config", "agent_version", "agent_name", "agent_id"):
        op.drop_column("sessions", column)
    op.drop_table("agent_versions")
    op.drop_table("agents")
