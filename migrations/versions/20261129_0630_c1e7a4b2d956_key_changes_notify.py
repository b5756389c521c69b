"""Announce a change to a tenant's keys or limits, for the API processes' key caches.

Each API process keeps the keys it has seen (key hash -> tenant, scope, limits) so that a request
needs no statement to authenticate (app/services/key_cache.py). These triggers NOTIFY
`threadline_keys` with the tenant's id in the transaction that revokes, rescopes or deletes one
of its keys (a tenant's deletion deletes its keys) or changes its limits, whatever path does it:
the API, the CLI, or SQL typed by an operator. A key's last_used_at, written once a minute, is
not a change to announce.

Revision ID: c1e7a4b2d956
Revises: a8c3e1f5b927
Create Date: 2026-11-29 06:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "c1e7a4b2d956"
down_revision: str | None = "a8c3e1f5b927"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(
        """
        CREATE FUNCTION threadline_keys_changed() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            IF TG_OP = 'DELETE' THEN
                PERFORM pg_notify('threadline_keys', OLD.tenant_id::text);
            ELSE
                PERFORM pg_notify('threadline_keys', NEW.tenant_id::text);
                IF TG_OP = 'UPDATE' AND OLD.tenant_id <> NEW.tenant_id THEN
                    PERFORM pg_notify('threadline_keys', OLD.tenant_id::text);
                END IF;
            END IF;
            RETURN NULL;
        END;
        $$
        """
    )
    op.execute(
        """
        CREATE TRIGGER threadline_key_changed
        AFTER UPDATE ON api_keys
        FOR EACH ROW
        WHEN (OLD.revoked_at IS DISTINCT FROM NEW.revoked_at
              OR OLD.read_only IS DISTINCT FROM NEW.read_only
              OR OLD.key_hash IS DISTINCT FROM NEW.key_hash
              OR OLD.tenant_id IS DISTINCT FROM NEW.tenant_id)
        EXECUTE FUNCTION threadline_keys_changed()
        """
    )
    op.execute(
        """
        CREATE TRIGGER threadline_key_deleted
        AFTER DELETE ON api_keys
        FOR EACH ROW EXECUTE FUNCTION threadline_keys_changed()
        """
    )
    op.execute(
        """
        CREATE TRIGGER threadline_limits_changed
        AFTER INSERT OR UPDATE OR DELETE ON tenant_limits
        FOR EACH ROW EXECUTE FUNCTION threadline_keys_changed()
        """
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER threadline_limits_changed ON tenant_limits")
    op.execute("DROP TRIGGER threadline_key_deleted ON api_keys")
    op.execute("DROP TRIGGER threadline_key_changed ON api_keys")
    op.execute("DROP FUNCTION threadline_keys_changed()")
