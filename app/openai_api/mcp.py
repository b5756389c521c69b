"""The Responses API's `mcp` tools as the MCP servers a run uses (`RunParams.mcp_inline`), and
its approval items' ids. Pure: no I/O.

A tool with a `server_url` describes its server (headers sealed by the caller before they are
stored); one without is the tenant's registered server of that `server_label`. Its tools are
offered as `<server_label>__<tool>`, and its calls are `mcp_call` items. A call whose rule is
to ask (`require_approval`, "always" by default as at OpenAI) ends the response with an
`mcp_approval_request` item; the next response answers it with `mcp_approval_response`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from app.core.mcp import SERVER_NAME
from app.openai_api.errors import OpenAIError, unsupported

MAX_SERVERS = 16
_KNOWN = {
    "type",
    "server_label",
    "server_url",
    "server_description",
    "headers",
    "authorization",
    "allowed_tools",
    "require_approval",
}
_FILTER_KEYS = {"tool_names", "read_only"}


@dataclass(frozen=True)
class McpTool:
    """One `mcp` tool of a request: the server, and its plain headers (sealed before they are
    stored with the run)."""

    label: str
    url: str | None
    headers: dict[str, str]
    allowed_tools: list[str] | None
    require_approval: Any

    def inline(self, sealed_headers: str | None) -> dict[str, Any]:
        """As `RunParams.mcp_inline` stores it."""
        return {
            "name": self.label,
            "url": self.url,
            "headers": sealed_headers,
            "allowed_tools": self.allowed_tools,
            "require_approval": self.require_approval,
        }


def parse_mcp_tool(tool: Mapping[str, Any], param: str) -> McpTool:
    unknown = set(tool) - _KNOWN
    if unknown:
        raise unsupported(f"{param}.{sorted(unknown)[0]}")
    label = tool.get("server_label")
    if not isinstance(label, str) or not SERVER_NAME.match(label):
        raise _invalid(
            f"{param}.server_label",
            "server_label is 1-32 letters, digits, - and single _ (its tools are named "
            "<server_label>__<tool>).",
        )
    url = tool.get("server_url")
    if url is not None and (
        not isinstance(url, str) or not url.startswith(("http://", "https://"))
    ):
        raise _invalid(f"{param}.server_url", "server_url must be an http(s) URL.")
    headers = _headers(tool, param)
    if url is None and headers:
        raise _invalid(
            f"{param}.headers",
            f"Without server_url, '{label}' is the MCP server registered under that name, "
            "with its own credentials: send no headers or authorization.",
        )
    return McpTool(
        label=label,
        url=url,
        headers=headers,
        allowed_tools=_allowed_tools(tool.get("allowed_tools"), f"{param}.allowed_tools"),
        require_approval=_require_approval(
            tool.get("require_approval"), f"{param}.require_approval"
        ),
    )


def _headers(tool: Mapping[str, Any], param: str) -> dict[str, str]:
    given = tool.get("headers")
    if given is None:
        given = {}
    if not isinstance(given, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in given.items()
    ):
        raise _invalid(f"{param}.headers", "headers must be an object of strings.")
    headers = dict(given)
    token = tool.get("authorization")
    if token is not None:
        if not isinstance(token, str) or not token:
            raise _invalid(f"{param}.authorization", "authorization must be a token string.")
        headers["Authorization"] = f"Bearer {token}"
    return headers


def _names(value: Any, param: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(n, str) and n for n in value):
        raise _invalid(param, "a list of tool names is expected.")
    return list(value)


def _allowed_tools(value: Any, param: str) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, Mapping):
        if value.get("read_only") is not None:
            raise unsupported(f"{param}.read_only", "name the allowed tools in tool_names")
        if set(value) - _FILTER_KEYS:
            raise unsupported(f"{param}.{sorted(set(value) - _FILTER_KEYS)[0]}")
        return _names(value.get("tool_names", []), f"{param}.tool_names")
    return _names(value, param)


def _require_approval(value: Any, param: str) -> Any:
    """The setting as given (checked), "always" when not given."""
    if value is None:
        return "always"
    if value in ("always", "never"):
        return value
    if not isinstance(value, Mapping) or not value or set(value) - {"always", "never"}:
        raise _invalid(
            param, "require_approval is 'always', 'never' or {always: filter, never: filter}."
        )
    out: dict[str, Any] = {}
    for key, tool_filter in value.items():
        where = f"{param}.{key}"
        if not isinstance(tool_filter, Mapping) or set(tool_filter) - _FILTER_KEYS:
            raise _invalid(where, "a filter is {tool_names: [...], read_only: true|false}.")
        checked: dict[str, Any] = {}
        if "tool_names" in tool_filter:
            checked["tool_names"] = _names(tool_filter["tool_names"], f"{where}.tool_names")
        if "read_only" in tool_filter:
            if not isinstance(tool_filter["read_only"], bool):
                raise _invalid(f"{where}.read_only", "read_only must be a boolean.")
            checked["read_only"] = tool_filter["read_only"]
        out[key] = checked
    return out


def _invalid(param: str, message: str) -> OpenAIError:
    return OpenAIError(400, message, param=param, code="invalid_value")
