"""The journal: tenants, API keys, sessions with fork lineage, append-only entries.

Revision ID: a1f0c0de0001
Revises:
Create Date: 2026-11-22 00:01:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB, UUID

revision: str = "a1f0c0de0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

KINDS = (
    "'message','tool_call','tool_result','summary','run_start','run_end','usage','error',"
    "'policy_violation','rollback'"
)

# Entries are append-only, enforced here rather than trusted to the code. The one exception is
# the cascade of a session delete: by the time it reaches the entries, the session row is gone.
APPEND_ONLY = [
    """
CREATE FUNCTION entries_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE'
       AND NOT EXISTS (SELECT 1 FROM sessions WHERE id = OLD.session_id) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'journal entries are append-only (% refused)', TG_OP
        USING ERRCODE = 'restrict_violation';
END
$$""",
    "CREATE TRIGGER entries_no_update BEFORE UPDATE ON entries"
    " FOR EACH ROW EXECUTE FUNCTION entries_append_only()",
    "CREATE TRIGGER entries_no_delete BEFORE DELETE ON entries"
    " FOR EACH ROW EXECUTE FUNCTION entries_append_only()",
    "CREATE TRIGGER entries_no_truncate BEFORE TRUNCATE ON entries"
    " FOR EACH STATEMENT EXECUTE FUNCTION entries_append_only()",
]


def _now() -> sa.Column[sa.DateTime]:
    return sa.Column(
        "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
    )


def _uuid_pk() -> sa.Column[str]:
    return sa.Column(
        "id", UUID(as_uuid=False), primary_key=True, server_default=sa.text("gen_random_uuid()")
    )


def upgrade() -> None:
    op.create_table(
        "tenants",
        _uuid_pk(),
        sa.Column("name", sa.Text, nullable=False, unique=True),
        _now(),
    )
    op.create_table(
        "api_keys",
        _uuid_pk(),
        sa.Column(
            "tenant_id",
            UUID(as_uuid=False),
            sa.ForeignKey("tenants.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("key_hash", sa.Text, nullable=False, unique=True),
        sa.Column("prefix", sa.Text, nullable=False),
        sa.Column("name", sa.Text),
        _now(),
        sa.Column("revoked_at", sa.DateTime(timezone=True)),
    )
    op.create_index("ix_api_keys_tenant_id", "api_keys", ["tenant_id"])
    op.create_table(
        "sessions",
        _uuid_pk(),
        sa.Column(
            "tenant_id",
            UUID(as_uuid=False),
            sa.ForeignKey("tenants.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("title", sa.Text),
        sa.Column("metadata", JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("config", JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("status", sa.Text, nullable=False, server_default=sa.text("'idle'")),
        sa.Column("rev", sa.BigInteger, nullable=False, server_default=sa.text("0")),
        sa.Column(
            "parent_id", UUID(as_uuid=False), sa.ForeignKey("sessions.id", ondelete="SET NULL")
        ),
        sa.Column("fork_seq", sa.BigInteger),
        sa.Column("lineage", JSONB, nullable=False, server_default=sa.text("'[]'::jsonb")),
        sa.Column("input_tokens", sa.BigInteger, nullable=False, server_default=sa.text("0")),
        sa.Column("output_tokens", sa.BigInteger, nullable=False, server_default=sa.text("0")),
        sa.Column("cached_tokens", sa.BigInteger, nullable=False, server_default=sa.text("0")),
        sa.Column("cost_usd", sa.Numeric(20, 10), nullable=False, server_default=sa.text("0")),
        _now(),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.CheckConstraint("rev >= 0", name="sessions_rev_nonnegative"),
    )
    op.execute(
        "CREATE INDEX sessions_tenant_created ON sessions (tenant_id, created_at DESC, id DESC)"
    )
    op.execute("CREATE INDEX sessions_metadata ON sessions USING gin (metadata jsonb_path_ops)")
    op.execute("CREATE INDEX sessions_lineage ON sessions USING gin (lineage jsonb_path_ops)")
    op.create_index("sessions_parent", "sessions", ["parent_id"])
    op.create_table(
        "entries",
        sa.Column(
            "session_id",
            UUID(as_uuid=False),
            sa.ForeignKey("sessions.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("id", sa.Text, nullable=False),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("payload", JSONB, nullable=False),
        sa.Column("refs", JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("token_count", sa.Integer, nullable=False),
        _now(),
        sa.PrimaryKeyConstraint("session_id", "seq", name="entries_pkey"),
        sa.UniqueConstraint("session_id", "id", name="entries_session_entry_id"),
        sa.CheckConstraint("seq > 0", name="entries_seq_positive"),
        sa.CheckConstraint(f"kind IN ({KINDS})", name="entries_kind_known"),
        sa.CheckConstraint("token_count >= 0", name="entries_token_count_nonnegative"),
    )
    for statement in APPEND_ONLY:
        op.execute(statement)


def downgrade() -> None:
    op.drop_table("entries")
    op.execute("DROP FUNCTION entries_append_only()")
    op.drop_table("sessions")
    op.drop_table("api_keys")
    op.drop_table("tenants")
