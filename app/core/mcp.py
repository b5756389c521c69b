"""MCP servers as a run uses them, and the namespacing of their tools (`<server>__<tool>`)."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from app.core.approvals import ApprovalRule

SEPARATOR = "__"
# A server's name: its tools are named `<server>__<tool>`, and providers allow 64 characters of
# [A-Za-z0-9_-] in a tool name.
SERVER_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]|_(?!_)){0,31}$")
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


def approval_rule(require_approval: Any, tool: str, *, read_only: bool = False) -> ApprovalRule:
    """A server's `require_approval` (the Responses API's: "always", "never", or
    `{"always": filter, "never": filter}`, a filter naming tools or matching read-only ones)
    as the rule of one of its tools. A person approves (`ask`) unless the setting says
    never for this tool: OpenAI's default, and the safe one for a server the request named."""
    if require_approval == "never":
        return "always"
    if isinstance(require_approval, Mapping) and _matches(
        require_approval.get("never"), tool, read_only
    ):
        return "always"
    return "ask"


def _matches(tool_filter: Any, tool: str, read_only: bool) -> bool:
    if not isinstance(tool_filter, Mapping):
        return False
    if tool in (tool_filter.get("tool_names") or ()):
        return True
    return tool_filter.get("read_only") is True and read_only


def split_name(name: str, servers: Collection[str]) -> tuple[str, str] | None:
    """(server, tool) of an offered MCP tool's name, None for a tool of none of `servers`."""
    server, separator, tool = name.partition(SEPARATOR)
    if not separator or not tool or server not in servers:
        return None
    return server, tool
