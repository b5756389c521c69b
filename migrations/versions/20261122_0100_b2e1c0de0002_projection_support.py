"""Projection support: a running token total per session, an index of summary checkpoints.

Revision ID: b2e1c0de0002
Revises: a1f0c0de0001
Create Date: 2026-11-22 01:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "b2e1c0de0002"
down_revision: str | None = "a1f0c0de0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # The sum of the thread's token counts so far: the stable coordinate the projector's chunked
    # windowing anchors to. Backfilled from each session's own entries (a fork's inherited
    # prefix only shifts its anchors, which is harmless).
    op.add_column(
        "sessions",
        sa.Column("token_total", sa.BigInteger, nullable=False, server_default=sa.text("0")),
    )
    op.execute(
        "UPDATE sessions SET token_total = totals.total FROM ("
        " SELECT session_id, sum(token_count) AS total FROM entries GROUP BY session_id"
        ") AS totals WHERE totals.session_id = sessions.id"
    )
    op.execute("CREATE INDEX entries_summaries ON entries (session_id, seq) WHERE kind = 'summary'")


def downgrade() -> None:
    op.drop_index("entries_summaries", table_name="entries")
    op.drop_column("sessions", "token_total")
