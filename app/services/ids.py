"""Ids as clients send them (here, not in app.core: the uuid module may read the host's MAC)."""

from __future__ import annotations

import uuid


def is_uuid(text: str) -> bool:
    """Whether `text` reads as a UUID (any form `uuid.UUID` takes), so it may name a row by id."""
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True
