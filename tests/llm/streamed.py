"""Helpers to read what a provider streamed (from testkit's fake upstream): every event, the
text, the tool calls reassembled."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import TypeVar

from app.llm.base import StreamEvent, TextDelta, ToolCallDelta

T = TypeVar("T")


async def collect(stream: AsyncIterator[T], into: list[T] | None = None) -> list[T]:
    """Everything a stream yields; with `into`, kept there too if the stream then fails."""
    items = into if into is not None else []
    async for item in stream:
        items.append(item)
    return items


def joined_text(events: Sequence[StreamEvent]) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


def tool_calls(events: Sequence[StreamEvent]) -> list[tuple[str | None, str | None, str]]:
    """The streamed tool calls reassembled, in index order: (id, name, JSON arguments)."""
    calls: dict[int, list[str | None]] = {}
    for event in events:
        if isinstance(event, ToolCallDelta):
            call = calls.setdefault(event.index, [None, None, ""])
            call[0] = call[0] or event.id
            call[1] = call[1] or event.name
            call[2] = (call[2] or "") + event.arguments
    return [(c[0], c[1], c[2] or "") for _, c in sorted(calls.items())]
