"""Drop sessions.token_total: windowing no longer anchors on the thread's running token sum.

A window now keeps the start the newest answer's context had (the answer's refs.context_from)
while it fits, so the projection needs no thread-wide coordinate, and an append no longer keeps
one up to date.

Revision ID: d4f8a2c6e013
Revises: c1e7a4b2d956
Create Date: 2026-11-29 09:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "d4f8a2c6e013"
down_revision: str | None = "c1e7a4b2d956"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.drop_column("sessions", "token_total")


def downgrade() -> None:
    op.add_column(
        "sessions",
        sa.Column("token_total", sa.BigInteger, nullable=False, server_default=sa.text("0")),
    )
    op.execute(
        "UPDATE sessions SET token_total = totals.total FROM ("
        " SELECT session_id, sum(token_count) AS total FROM entries GROUP BY session_id"
        ") AS totals WHERE totals.session_id = sessions.id"
    )
