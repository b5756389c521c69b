"""Session metadata: small string maps clients filter on, and their merge-patch rule."""

from __future__ import annotations

from collections.abc import Mapping

MAX_KEYS = 16
MAX_KEY_LENGTH = 64
MAX_VALUE_LENGTH = 512


class MetadataError(ValueError):
    pass


def merge_patch(current: Mapping[str, str], patch: Mapping[str, str | None]) -> dict[str, str]:
    """RFC 7386 on a flat map: a null value removes the key, any other value sets it."""
    merged = dict(current)
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    if len(merged) > MAX_KEYS:
        raise MetadataError(
            f"metadata may hold at most {MAX_KEYS} keys, this would be {len(merged)}"
        )
    return merged
