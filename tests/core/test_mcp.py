"""MCP tool names and the Responses API's require_approval as Threadline's approval rules."""

from __future__ import annotations

import pytest

from app.core.mcp import approval_rule, split_name
from app.core.run_policy import RunPolicy


@pytest.mark.parametrize(
    ("setting", "tool", "read_only", "rule"),
    [
        ("always", "add", False, "ask"),
        ("never", "add", False, "always"),
        (None, "add", False, "ask"),  # not given: a person approves, as at OpenAI
        ({"never": {"tool_names": ["add"]}}, "add", False, "always"),
        ({"never": {"tool_names": ["add"]}}, "drop", False, "ask"),
        ({"always": {"tool_names": ["drop"]}}, "add", False, "ask"),
        ({"never": {"read_only": True}}, "look", True, "always"),
        ({"never": {"read_only": True}}, "drop", False, "ask"),
    ],
)
def test_require_approval_as_a_rule(setting: object, tool: str, read_only: bool, rule: str) -> None:
    assert approval_rule(setting, tool, read_only=read_only) == rule


def test_split_name_knows_only_the_runs_servers() -> None:
    assert split_name("docs__search", {"docs"}) == ("docs", "search")
    assert split_name("docs__a__b", {"docs"}) == ("docs", "a__b")
    assert split_name("other__search", {"docs"}) is None
    assert split_name("calculator", {"docs"}) is None
    assert split_name("docs__", {"docs"}) is None


def test_a_servers_rules_yield_to_the_ones_the_policy_names() -> None:
    policy = RunPolicy.model_validate({"tool_approval": {"tools": {"docs__drop": "never"}}})
    merged = policy.with_tool_rules({"docs__drop": "ask", "docs__add": "ask"})
    assert merged.approval_rule("docs__drop") == "never"
    assert merged.needs_approval("docs__add")
    assert not RunPolicy().with_tool_rules({"docs__add": "always"}).needs_approval("docs__add")
    assert RunPolicy().with_tool_rules({"docs__add": "ask"}).needs_approval("docs__add")
