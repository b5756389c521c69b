"""API key scopes and use, per-tenant limits, request counters and daily usage.

`tenant_usage` is filled by every run's end (in the transaction that journals its usage entry)
and backfilled here from the runs table: deleting a session deletes its runs and entries, but
not what the tenant used.

Revision ID: f2b8c0de0012
Revises: e1a7cac0e011
Create Date: 2026-11-25 06:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import UUID

revision: str = "f2b8c0de0012"
down_revision: str | None = "e1a7cac0e011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

LIMITS = (
    "requests_per_minute",
    "concurrent_runs",
    "input_tokens_per_day",
    "output_tokens_per_day",
    "max_sessions",
)


def _tenant_fk() -> sa.Column:  # type: ignore[type-arg]
    return sa.Column(
        "tenant_id",
        UUID(as_uuid=False),
        sa.ForeignKey("tenants.id", ondelete="CASCADE"),
        nullable=False,
    )


def upgrade() -> None:
    op.add_column(
        "api_keys",
        sa.Column("read_only", sa.Boolean(), nullable=False, server_default=sa.text("false")),
    )
    op.add_column("api_keys", sa.Column("last_used_at", sa.DateTime(timezone=True)))
    op.create_table(
        "tenant_limits",
        _tenant_fk(),
        *(sa.Column(name, sa.BigInteger()) for name in LIMITS),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.PrimaryKeyConstraint("tenant_id", name="tenant_limits_pkey"),
        *(sa.CheckConstraint(f"{name} >= 0", name=f"tenant_limits_{name}") for name in LIMITS),
    )
    op.create_table(
        "tenant_request_counts",
        _tenant_fk(),
        sa.Column("window_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("count", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", name="tenant_request_counts_pkey"),
    )
    op.create_table(
        "tenant_usage",
        _tenant_fk(),
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("model", sa.Text(), nullable=False),
        *(
            sa.Column(name, sa.BigInteger(), nullable=False, server_default=sa.text("0"))
            for name in (
                "runs",
                "input_tokens",
                "output_tokens",
                "cached_tokens",
                "cache_write_tokens",
                "unpriced_runs",
            )
        ),
        sa.Column("cost_usd", sa.Numeric(20, 10), nullable=False, server_default=sa.text("0")),
        sa.PrimaryKeyConstraint("tenant_id", "day", "model", name="tenant_usage_pkey"),
    )
    op.execute(
        """
        INSERT INTO tenant_usage (tenant_id, day, model, runs, input_tokens, output_tokens,
                                  cached_tokens, cache_write_tokens, unpriced_runs, cost_usd)
        SELECT tenant_id, (ended_at AT TIME ZONE 'UTC')::date, model, count(*),
               sum(input_tokens), sum(output_tokens), sum(cached_tokens),
               sum(cache_write_tokens), count(*) FILTER (WHERE cost_usd IS NULL),
               coalesce(sum(cost_usd), 0)
        FROM runs
        WHERE ended_at IS NOT NULL AND input_tokens + output_tokens > 0
        GROUP BY 1, 2, 3
        """
    )


def downgrade() -> None:
    op.drop_table("tenant_usage")
    op.drop_table("tenant_request_counts")
    op.drop_table("tenant_limits")
    op.drop_column("api_keys", "last_used_at")
    op.drop_column("api_keys", "read_only")
