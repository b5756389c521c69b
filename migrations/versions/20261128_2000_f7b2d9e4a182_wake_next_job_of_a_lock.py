"""Wake the workers when a job that held a lock ends and another job of that lock waits.

A session's runs share a procrastinate lock, so a queued run's job cannot be fetched while the
run before it holds the lock. Procrastinate announces a job only when it is inserted; when the
lock is freed nobody is told, and the next run waited for a worker's fetch poll (5 s). This
trigger announces the waiting job (procrastinate's own `job_inserted` notification) in the
transaction that ends the lock holder, whichever path ends it (a worker finishing its job, the
in-process handoff, a dead worker's job failed, a deletion): the next run starts as soon as that
commits, on any process.

Revision ID: f7b2d9e4a182
Revises: e6a4c2d8f731
Create Date: 2026-11-28 20:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "f7b2d9e4a182"
down_revision: str | None = "e6a4c2d8f731"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(
        """
        CREATE FUNCTION threadline_wake_next_job_of_lock() RETURNS trigger
        LANGUAGE plpgsql AS $$
        DECLARE
            next_job procrastinate_jobs%ROWTYPE;
            payload TEXT;
        BEGIN
            SELECT * INTO next_job FROM procrastinate_jobs
             WHERE lock = OLD.lock AND status = 'todo' AND id <> OLD.id
             ORDER BY priority DESC, id LIMIT 1;
            IF FOUND THEN
                payload := json_build_object('type', 'job_inserted', 'job_id', next_job.id)::text;
                PERFORM pg_notify('procrastinate_queue_v1#' || next_job.queue_name, payload);
                PERFORM pg_notify('procrastinate_any_queue_v1', payload);
            END IF;
            RETURN NULL;
        END;
        $$
        """
    )
    op.execute(
        """
        CREATE TRIGGER threadline_wake_next_job_of_lock_on_end
        AFTER UPDATE OF status ON procrastinate_jobs
        FOR EACH ROW
        WHEN (OLD.lock IS NOT NULL AND OLD.status = 'doing' AND NEW.status <> 'doing')
        EXECUTE FUNCTION threadline_wake_next_job_of_lock()
        """
    )
    op.execute(
        """
        CREATE TRIGGER threadline_wake_next_job_of_lock_on_delete
        AFTER DELETE ON procrastinate_jobs
        FOR EACH ROW
        WHEN (OLD.lock IS NOT NULL AND OLD.status = 'doing')
        EXECUTE FUNCTION threadline_wake_next_job_of_lock()
        """
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER threadline_wake_next_job_of_lock_on_delete ON procrastinate_jobs")
    op.execute("DROP TRIGGER threadline_wake_next_job_of_lock_on_end ON procrastinate_jobs")
    op.execute("DROP FUNCTION threadline_wake_next_job_of_lock()")
