"""Reasoning tokens counted apart on runs, sessions and the tenants' daily usage.

Of the output tokens, those a reasoning model thought with (OpenAI reports them): usage and
reports show them separately; they are priced as output, and already counted in it.

Revision ID: c4d9e2a7b518
Revises: b3d1f0c0e013
Create Date: 2026-11-28 15:36:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "c4d9e2a7b518"
down_revision: str | None = "b3d1f0c0e013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("runs", "sessions", "tenant_usage")


def upgrade() -> None:
    # A constant default: Postgres adds the column without rewriting the table.
    for table in TABLES:
        op.add_column(
            table,
            sa.Column("reasoning_tokens", sa.BigInteger(), nullable=False, server_default="0"),
        )


def downgrade() -> None:
    for table in TABLES:
        op.drop_column(table, "reasoning_tokens")
