"""The reasoning check at the door: a setting a model cannot take is refused (422), before
anything is written."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.config import Settings
from app.core import reasoning as reasonings
from app.core.tool_choice import ToolChoice
from app.llm.catalog import can_reason
from app.services.errors import Invalid

UNSUPPORTED = "reasoning_not_supported"


def check(
    settings: Settings,
    model: str,
    session: Mapping[str, Any] | None,
    ask: Mapping[str, Any] | None,
    loc: list[str],
    tool_choice: ToolChoice = "auto",
) -> reasonings.Reasoning | None:
    """The reasoning a run of `model` uses (the ask's setting, else the session's; None: off);
    Invalid when `model` cannot reason, or (Anthropic) its first turn's tool_choice forces a
    tool call, which extended thinking does not allow. `loc`: where the setting was given."""
    reasoning = reasonings.effective(session, ask)
    if reasoning is None:
        return None
    if not can_reason(settings, model):
        raise Invalid(UNSUPPORTED, reasonings.unsupported(model), {"loc": loc, "model": model})
    if model.partition(":")[0] == "anthropic" and tool_choice not in ("auto", "none"):
        raise Invalid(
            "invalid_tool_choice",
            "with reasoning, Anthropic models take tool_choice auto or none only",
            {"loc": ["body", "tool_choice"], "model": model},
        )
    return reasoning
