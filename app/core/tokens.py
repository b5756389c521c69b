"""Token counting for journal entries: what an entry costs in a model's context."""

from __future__ import annotations

import json
from typing import Any

from app.core.entries import EntryKind


def heuristic_tokens(text: str) -> int:
    """About four characters per token: the classic estimate, rounded up."""
    return (len(text) + 3) // 4


def entry_text(kind: EntryKind, payload: dict[str, Any]) -> str:
    """The text of an entry as a model would read it (content, call arguments, result)."""
    if kind == EntryKind.MESSAGE:
        content = payload["content"]
        if isinstance(content, str):
            return content
        return "".join(str(p.get("text", "")) for p in content)
    if kind == EntryKind.TOOL_CALL:
        return str(payload["name"]) + json.dumps(payload["arguments"], sort_keys=True)
    if kind == EntryKind.TOOL_RESULT:
        content = payload["content"]
        return content if isinstance(content, str) else json.dumps(content, sort_keys=True)
    if kind == EntryKind.SUMMARY:
        return str(payload["content"])
    return ""


def count_entry_tokens(kind: EntryKind, payload: dict[str, Any]) -> int:
    """Counted once, when the entry is appended; stored as the entry's token_count."""
    text = entry_text(kind, payload)
    return heuristic_tokens(text) if text else 0
