"""Agents as configuration: a version's config under a session's own, and agent references."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Policies are partial layers: a session's fields override its agent's field by field.
LAYERED = ("context_policy", "run_policy")
# `name` or `name@version` (the version a session is pinned to; default: the latest).
REFERENCE = re.compile(
    r"^(?P<name>[A-Za-z0-9][A-Za-z0-9_.-]{0,63})(?:@(?P<version>[1-9][0-9]{0,8}))?$"
)


@dataclass(frozen=True, slots=True)
class AgentPin:
    """The agent version a session was created from (or moved to), with that version's config
    (a copy: versions never change)."""

    id: str
    name: str
    version: int
    config: Mapping[str, Any]


def resolved(agent_config: Mapping[str, Any], own: Mapping[str, Any]) -> dict[str, Any]:
    """The config a session's runs use: its agent version's, with the session's own fields over
    it (the policy layers merged field by field)."""
    config = {**agent_config, **own}
    for name in LAYERED:
        if name in agent_config and name in own:
            config[name] = {**agent_config[name], **own[name]}
    return config


def parse_reference(reference: str) -> tuple[str, int | None] | None:
    """`name` or `name@version`; None if it is neither."""
    found = REFERENCE.match(reference)
    if found is None:
        return None
    version = found.group("version")
    return found.group("name"), int(version) if version else None


def with_variables(instructions: str, variables: Mapping[str, str]) -> str:
    """Instructions with `{{name}}` placeholders filled in (OpenAI's reusable prompts)."""
    return re.sub(
        r"\{\{\s*([A-Za-z0-9_.-]+)\s*\}\}",
        lambda m: variables.get(m.group(1), m.group(0)),
        instructions,
    )
