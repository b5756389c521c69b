"""What every tool call is given (ToolContext) and gives back (ToolOutcome).

A module of their own so that the registry and the webhook tools both import them and neither
imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine


@dataclass(frozen=True)
class ToolContext:
    tenant_id: str
    session_id: str
    run_id: str
    tool_call_id: str
    engine: AsyncEngine | None = None  # for tools that read the journal


@dataclass(frozen=True)
class ToolOutcome:
    content: Any
    is_error: bool = False
