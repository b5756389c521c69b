"""Provider-neutral messages: what a projection produces and the provider formats consume."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

Role = Literal["system", "user", "assistant", "tool"]
# Parts are JSON objects: {"type": "text", "text"} or {"type": "image_url", "url", "detail"?}.
Content = str | tuple[dict[str, Any], ...]


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Message:
    role: Role
    content: Content
    name: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None  # role "tool": the call this answers
    is_error: bool = False  # role "tool": the tool failed


@dataclass(frozen=True, slots=True)
class ToolSpec:
    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})


def canonical_json(value: Any) -> str:
    """One spelling per JSON value (sorted keys, no spaces): what is counted is what is sent.

    Postgres JSONB does not keep key order, so anything rendered from stored JSON must not
    depend on it.
    """
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def result_text(content: Any) -> str:
    """A tool result as the text a model reads."""
    return content if isinstance(content, str) else canonical_json(content)


def text_of(content: str | Sequence[Mapping[str, Any]]) -> str:
    if isinstance(content, str):
        return content
    return "".join(str(p.get("text", "")) for p in content if p.get("type") == "text")
