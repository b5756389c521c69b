"""Which tools the model may or must call on a turn (tool_choice, parallel_tool_calls), and
how each provider's API says it. Pure.

An ask's choice is "auto" (the model decides), "none" (no tool call), "required" (at least one
call) or a named tool (exactly that one). A forced choice ("required" or a named tool) holds
for the run's first model turn only: the loop asks the model again after its calls, and a
model forced on every turn would never give an answer. Later turns are "auto". "none" holds
on every turn (its first turn calls nothing, so there is no later one).

`parallel_tool_calls: false` (at most one call per turn) holds on every turn.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Literal

ToolChoiceMode = Literal["auto", "none", "required"]


@dataclass(frozen=True, slots=True)
class NamedTool:
    """The model must call this tool (one of the run's tools)."""

    name: str


ToolChoice = ToolChoiceMode | NamedTool
FORCED_TURN = 1  # the model turn a forced choice applies to


def parse(value: Any) -> ToolChoice:
    """The choice as stored with a run and sent in an ask: a mode, or
    `{"type": "function", "name": X}`. Anything else raises ValueError."""
    if value in ("auto", "none", "required"):
        return value  # type: ignore[no-any-return]
    if isinstance(value, dict) and value.get("type") == "function":
        name = value.get("name")
        if isinstance(name, str) and name and set(value) == {"type", "name"}:
            return NamedTool(name)
    raise ValueError(
        'tool_choice is "auto", "none", "required" or {"type": "function", "name": <tool>}'
    )


def as_json(choice: ToolChoice) -> str | dict[str, str]:
    """The stored form (what `parse` reads back)."""
    if isinstance(choice, NamedTool):
        return {"type": "function", "name": choice.name}
    return choice


def is_forced(choice: ToolChoice) -> bool:
    return choice == "required" or isinstance(choice, NamedTool)


def for_turn(choice: ToolChoice, iteration: int) -> ToolChoice:
    """The choice the model is sent on model turn `iteration` (1 = the run's first)."""
    if is_forced(choice) and iteration != FORCED_TURN:
        return "auto"
    return choice


def problem(choice: ToolChoice, tool_names: Collection[str]) -> str | None:
    """Why `choice` cannot be served with these tools offered, or None."""
    if choice == "required" and not tool_names:
        return 'tool_choice "required" needs at least one tool, and the run offers none'
    if isinstance(choice, NamedTool) and choice.name not in tool_names:
        offered = ", ".join(sorted(tool_names)) or "none"
        return f"tool_choice names {choice.name!r}, which is not one of the run's tools ({offered})"
    return None


def openai_fields(choice: ToolChoice, parallel: bool, has_tools: bool) -> dict[str, Any]:
    """Chat Completions' `tool_choice` and `parallel_tool_calls`, only where they differ from
    the API's defaults (auto, true): OpenAI refuses both without tools, and compatible servers
    that know neither keep working for asks that set neither."""
    if not has_tools:
        return {}
    fields: dict[str, Any] = {}
    if isinstance(choice, NamedTool):
        fields["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    elif choice != "auto":
        fields["tool_choice"] = choice
    if not parallel and choice != "none":
        fields["parallel_tool_calls"] = False
    return fields


def anthropic_tool_choice(
    choice: ToolChoice, parallel: bool, has_tools: bool
) -> dict[str, Any] | None:
    """The Messages API's `tool_choice` (None: send none, the API's default "auto" with
    parallel calls allowed). Parallel calls are turned off inside it (disable_parallel_tool_use);
    "none" has no such field."""
    if not has_tools:
        return None
    if choice == "none":
        return {"type": "none"}
    wire: dict[str, Any]
    if isinstance(choice, NamedTool):
        wire = {"type": "tool", "name": choice.name}
    elif choice == "required":
        wire = {"type": "any"}
    else:
        wire = {"type": "auto"}
    if not parallel:
        wire["disable_parallel_tool_use"] = True
    elif wire == {"type": "auto"}:
        return None
    return wire
