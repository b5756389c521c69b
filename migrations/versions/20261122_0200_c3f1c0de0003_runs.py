"""Runs, their SSE events, and procrastinate's job queue schema.

Revision ID: c3f1c0de0003
Revises: b2e1c0de0002
Create Date: 2026-11-22 02:00:00

procrastinate's own schema is installed from the pinned package's schema.sql; upgrading
procrastinate means a new revision here that applies its migration scripts in order.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB, UUID
from sqlalchemy.util import await_only

revision: str = "c3f1c0de0003"
down_revision: str | None = "b2e1c0de0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

RUN_STATUSES = "'queued','running','requires_action','completed','failed','cancelled','interrupted'"


def _execute_script(sql: str) -> None:
    """Run a multi-statement script (asyncpg's simple-query protocol takes a whole script)."""
    driver_connection = op.get_bind().connection.driver_connection
    await_only(driver_connection.execute(sql))


def upgrade() -> None:
    _execute_script(resources.files("procrastinate.sql").joinpath("schema.sql").read_text())
    op.create_table(
        "runs",
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
            "session_id",
            UUID(as_uuid=False),
            sa.ForeignKey("sessions.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("status", sa.Text, nullable=False, server_default=sa.text("'queued'")),
        sa.Column("model", sa.Text, nullable=False),
        sa.Column("params", JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("idempotency_key", sa.Text),
        sa.Column("user_entry_seq", sa.BigInteger),
        sa.Column("end_entry_seq", sa.BigInteger),
        sa.Column("attempts", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("result", sa.Text),
        sa.Column("error", JSONB),
        sa.Column("cancel_mode", sa.Text),
        sa.Column("job_id", sa.BigInteger),
        sa.Column("input_tokens", sa.BigInteger, nullable=False, server_default=sa.text("0")),
        sa.Column("output_tokens", sa.BigInteger, nullable=False, server_default=sa.text("0")),
        sa.Column("cached_tokens", sa.BigInteger, nullable=False, server_default=sa.text("0")),
        sa.Column("cost_usd", sa.Numeric(20, 10)),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column("started_at", sa.DateTime(timezone=True)),
        sa.Column("ended_at", sa.DateTime(timezone=True)),
        sa.CheckConstraint(f"status IN ({RUN_STATUSES})", name="runs_status_known"),
        sa.UniqueConstraint("session_id", "idempotency_key", name="runs_idempotency_key"),
    )
    op.execute("CREATE INDEX runs_session_created ON runs (session_id, created_at DESC)")
    # The active run of a session is looked up on every ask and every /stream.
    op.execute(
        "CREATE INDEX runs_session_active ON runs (session_id, created_at)"
        " WHERE status IN ('queued', 'running', 'requires_action')"
    )
    op.execute("CREATE INDEX runs_ended ON runs (ended_at) WHERE ended_at IS NOT NULL")
    op.create_table(
        "run_events",
        sa.Column(
            "run_id",
            UUID(as_uuid=False),
            sa.ForeignKey("runs.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("seq", sa.Integer, nullable=False),
        sa.Column("type", sa.Text, nullable=False),
        sa.Column("data", JSONB, nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.PrimaryKeyConstraint("run_id", "seq", name="run_events_pkey"),
    )


def downgrade() -> None:
    op.drop_table("run_events")
    op.drop_table("runs")
    _execute_script(
        """
        DROP TABLE IF EXISTS procrastinate_events, procrastinate_periodic_defers,
            procrastinate_jobs, procrastinate_workers CASCADE;
        DROP TYPE IF EXISTS procrastinate_job_to_defer_v1, procrastinate_job_event_type,
            procrastinate_job_status CASCADE;
        DO $$
        DECLARE f record;
        BEGIN
            FOR f IN SELECT oid::regprocedure AS signature FROM pg_proc
                     WHERE proname LIKE 'procrastinate%' LOOP
                EXECUTE 'DROP FUNCTION IF EXISTS ' || f.signature || ' CASCADE';
            END LOOP;
        END $$;
        """
    )
