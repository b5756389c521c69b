"""Sessions and runs count the prompt tokens written to a provider's cache.

Anthropic bills a cache write above the input price and reports it apart; cache reads were
already counted (cached_tokens).

Revision ID: e1a7cac0e011
Revises: d0e5c0de0010
Create Date: 2026-11-25 05:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "e1a7cac0e011"
down_revision: str | None = "d0e5c0de0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    for table in ("sessions", "runs"):
        op.add_column(
            table,
            sa.Column(
                "cache_write_tokens", sa.BigInteger(), nullable=False, server_default=sa.text("0")
            ),
        )


def downgrade() -> None:
    for table in ("sessions", "runs"):
        op.drop_column(table, "cache_write_tokens")
