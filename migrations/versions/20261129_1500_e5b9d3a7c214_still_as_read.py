"""A check that aborts a statement whose rows changed since its caller read them.

A run's end is written in one statement when the worker knows the rows it depends on (its
session's, at the version its start read, and its run's) and nothing else needs the rows
locked: threadline_still_as_read(false) raises SQLSTATE TL001, which aborts everything the
statement wrote; the worker then ends the run under the rows' locks (app/db/runs.end_run).

Revision ID: e5b9d3a7c214
Revises: d4f8a2c6e013
Create Date: 2026-11-29 15:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "e5b9d3a7c214"
down_revision: str | None = "d4f8a2c6e013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(
        """
        CREATE FUNCTION threadline_still_as_read(unchanged boolean) RETURNS boolean
        LANGUAGE plpgsql VOLATILE AS $$
        BEGIN
            IF unchanged IS NOT TRUE THEN
                RAISE EXCEPTION 'the rows changed since they were read'
                    USING ERRCODE = 'TL001';
            END IF;
            RETURN true;
        END;
        $$
        """
    )


def downgrade() -> None:
    op.execute("DROP FUNCTION threadline_still_as_read(boolean)")
