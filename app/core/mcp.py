"""MCP servers as a run uses them, and the namespacing of their tools (`<server>__<tool>`)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

SEPARATOR = "__"
Transport = Literal["streamable_http", "sse"]


def tool_name(server: str, tool: str) -> str:
    return f"{server}{SEPARATOR}{tool}"


@dataclass(frozen=True)
class McpServer:
    """A server as a run uses it: credentials decrypted, in memory only."""

    name: str
    url: str
    transport: Transport = "streamable_http"
    headers: Mapping[str, str] = field(default_factory=dict)
    allowed_tools: tuple[str, ...] | None = None  # None: every tool the server lists
    require_approval: Any = None  # the facade's setting, kept for the approval policy

    def cache_key(self) -> str:
        identity = json.dumps([self.url, self.transport, sorted(self.headers.items())])
        return hashlib.sha256(identity.encode()).hexdigest()
