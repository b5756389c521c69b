"""Runs record why the model stopped (stop, length, ...): a truncated answer is marked.

Revision ID: ab10f1e50008
Revises: a7b2c0de0007
Create Date: 2026-11-25 01:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "ab10f1e50008"
down_revision: str | None = "a7b2c0de0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("finish_reason", sa.Text()))


def downgrade() -> None:
    op.drop_column("runs", "finish_reason")
