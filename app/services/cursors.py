"""Keyset cursors of newest-first lists: a page's last (created_at, id), opaque to clients."""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from datetime import datetime
from typing import Any

from app.services.errors import Invalid


def encode_cursor(created_at: datetime, row_id: Any) -> str:
    raw = json.dumps([created_at.isoformat(), str(row_id)]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created_at, row_id = json.loads(raw)
        moment = datetime.fromisoformat(created_at)
        if moment.tzinfo is None:
            raise ValueError("naive timestamp")
        return moment, str(uuid.UUID(row_id))
    except (binascii.Error, ValueError, TypeError, AttributeError) as exc:
        raise Invalid(
            "invalid_cursor", "the cursor is not one this API returned", {"cursor": cursor}
        ) from exc
