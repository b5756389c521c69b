"""Webhook endpoints' signing secrets encrypted at rest: the column becomes encrypted_secret and
every existing secret is encrypted under the newest secret key (app/credentials.py).

The vault comes from the caller (`upgrade_to_head(url, vault)`: `threadline serve`, `migrate`
and the admin commands pass their settings' keys), else from Settings() (THREADLINE_SECRET_KEYS
or the key file under THREADLINE_DATA_DIR), as the alembic CLI would run it. It is only opened
when there is a secret to encrypt.

Revision ID: e6a4c2d8f731
Revises: d5f3a2b1c630
Create Date: 2026-11-28 19:50:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

from app.config import Settings
from app.credentials import Vault, vault_for

revision: str = "e6a4c2d8f731"
down_revision: str | None = "d5f3a2b1c630"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PLAIN_PREFIX = "whsec_"  # every secret the service made; a Fernet token starts "gAAAA"


def _vault() -> Vault:
    given = context.config.attributes.get("vault")
    return given if isinstance(given, Vault) else vault_for(Settings())


def _rewrite(select_where: str, change: str) -> None:
    conn = op.get_bind()
    rows = conn.execute(
        sa.text(f"SELECT id, encrypted_secret FROM webhook_endpoints WHERE {select_where}"),
        {"prefix": PLAIN_PREFIX + "%"},
    ).all()
    if not rows:
        return
    vault = _vault()
    convert = vault.encrypt if change == "encrypt" else vault.decrypt
    for endpoint_id, value in rows:
        conn.execute(
            sa.text("UPDATE webhook_endpoints SET encrypted_secret = :value WHERE id = :id"),
            {"value": convert(value), "id": endpoint_id},
        )


def upgrade() -> None:
    op.alter_column("webhook_endpoints", "secret", new_column_name="encrypted_secret")
    _rewrite("encrypted_secret LIKE :prefix", "encrypt")


def downgrade() -> None:
    _rewrite("encrypted_secret NOT LIKE :prefix", "decrypt")
    op.alter_column("webhook_endpoints", "encrypted_secret", new_column_name="secret")
