"""What the model is told about each built-in tool: its description and full JSON schema.

Pure: the projection offers these, app/tools runs them. A run that declares a built-in by name
only (`{"name": "calculator", "kind": "builtin"}`) still offers the model the whole schema.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.core.eviction import READ_TOOL_OUTPUT_DEFINITION
from app.core.memory import MEMORY_TOOLS

SEARCH_LIMIT_MAX = 20  # the most hits search_history returns

_OWN: tuple[dict[str, Any], ...] = (
    {
        "name": "current_time",
        "description": "The current date and time in UTC, as ISO 8601 (e.g. "
        '"2026-01-31T14:05:00+00:00").',
        "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
    },
    {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression exactly: numbers, parentheses and "
        "+ - * / // % ** (exponents up to 1000, integers up to 4000 digits, expressions up to "
        "10000 characters). Returns the number, or an error for what is out of bounds.",
        "parameters": {
            "type": "object",
            "properties": {
                "expression": {
                    "type": "string",
                    "description": 'The expression, e.g. "(4 + 2) * 3 - 2 ** 3".',
                }
            },
            "required": ["expression"],
            "additionalProperties": False,
        },
    },
    {
        "name": "search_history",
        "description": "Full-text search of this conversation's whole history, including what "
        "was summarized or left out of your context. Returns the best hits first, each with "
        "its seq, kind and an excerpt.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {
                    "type": "string",
                    "description": 'Web-style query: words, "exact phrases", -excluded words.',
                },
                "limit": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": SEARCH_LIMIT_MAX,
                    "default": 5,
                    "description": "How many hits to return at most.",
                },
            },
            "required": ["query"],
            "additionalProperties": False,
        },
    },
)

BUILTIN_TOOLS: dict[str, dict[str, Any]] = {
    t["name"]: {"name": t["name"], "description": t["description"], "parameters": t["parameters"]}
    for t in (*_OWN, *MEMORY_TOOLS, READ_TOOL_OUTPUT_DEFINITION)
}


def with_builtin_schema(tool: Mapping[str, Any]) -> Mapping[str, Any]:
    """A declared tool as the model sees it: a known built-in gets its own schema (the service
    implements it, so a declared one could only mislead the model) and, unless the declaration
    says otherwise, its own description; any other tool is left as declared."""
    known = BUILTIN_TOOLS.get(str(tool.get("name")))
    if tool.get("kind") != "builtin" or known is None:
        return tool
    return {
        **tool,
        "description": tool.get("description") or known["description"],
        "parameters": known["parameters"],
    }
