"""Steers keep the ask's Idempotency-Key: a steer sent twice is committed once.

Revision ID: a8c3e1f5b927
Revises: f7b2d9e4a182
Create Date: 2026-11-28 20:40:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "a8c3e1f5b927"
down_revision: str | None = "f7b2d9e4a182"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("steers", sa.Column("idempotency_key", sa.Text(), nullable=True))
    op.create_unique_constraint(
        "steers_idempotency_key", "steers", ["session_id", "idempotency_key"]
    )


def downgrade() -> None:
    op.drop_constraint("steers_idempotency_key", "steers", type_="unique")
    op.drop_column("steers", "idempotency_key")
