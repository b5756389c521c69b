"""The approval rules of tools, and how they combine with the run policy's allow/deny lists."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.core.approvals import ToolApproval, edited_note, rejected_text
from app.core.run_policy import RunPolicy, merged


def test_named_tools_take_their_rule_and_others_the_default() -> None:
    rules = ToolApproval(default="ask", tools={"lookup": "always", "wipe": "never"})
    assert [rules.rule(t) for t in ("lookup", "wipe", "send")] == ["always", "never", "ask"]
    assert ToolApproval().rule("anything") == "always"


def test_never_denies_and_ask_needs_approval_only_for_allowed_tools() -> None:
    policy = RunPolicy.model_validate(
        {"tools_deny": ["send"], "tool_approval": {"default": "ask", "tools": {"wipe": "never"}}}
    )
    assert not policy.allows("wipe") and not policy.needs_approval("wipe")
    assert not policy.allows("send") and not policy.needs_approval("send")
    assert policy.allows("lookup") and policy.needs_approval("lookup")


def test_an_asks_rules_replace_the_sessions() -> None:
    session = {"tool_approval": {"default": "ask"}}
    ask = {"tool_approval": {"tools": {"x": "never"}}}
    assert merged(session, ask).tool_approval == ToolApproval(tools={"x": "never"})
    assert merged(session, None).tool_approval == ToolApproval(default="ask")


@pytest.mark.parametrize(
    "bad", [{"default": "sometimes"}, {"tools": {"x": True}}, {"other": 1}, {"tools": ["x"]}]
)
def test_unknown_rules_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        RunPolicy.model_validate({"tool_approval": bad})


def test_what_the_model_reads() -> None:
    assert rejected_text("too costly").endswith("Their reason: too costly")
    assert "not run" in rejected_text(None)
    assert '{"a": 1}' in edited_note({"a": 1})
