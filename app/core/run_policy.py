"""RunPolicy: the limits of an agent's runs, and the checks that can be made before an ask."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.core.approvals import ApprovalRule, ToolApproval


class RunPolicy(BaseModel):
    # strict: a JSON boolean is not a count (what the JSON schema of these fields says).
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    max_iterations: Annotated[int, Field(ge=1, le=1000)] = Field(
        default=10, description="Model turns with tool calls per run."
    )
    max_turns: Annotated[int, Field(ge=1)] | None = Field(
        default=None, description="Asks (runs) per session."
    )
    max_total_tokens: Annotated[int, Field(ge=1)] | None = Field(
        default=None, description="Input plus output tokens per session, across its runs."
    )
    max_run_seconds: Annotated[float, Field(gt=0)] | None = Field(
        default=None, description="How long one run may take."
    )
    tools_allow: list[str] | None = Field(
        default=None, description="If set, only these tools may be called."
    )
    tools_deny: list[str] = Field(default_factory=list, description="Tools that may not be called.")
    on_denied: Literal["continue", "stop"] = Field(
        default="continue",
        description="A denied call gets an error result; stop also ends the run.",
    )
    # None (not given): every call runs at once. Kept absent rather than defaulted, so that a
    # stored policy is what the client gave.
    tool_approval: ToolApproval | None = Field(
        default=None,
        description="Which tool calls wait for a person's approval (`ask`), run at once "
        "(`always`) or are never offered (`never`): per tool name, with a default. Not given: "
        "every call runs at once.",
    )

    def allows(self, tool: str) -> bool:
        return (
            tool not in self.tools_deny
            and (self.tools_allow is None or tool in self.tools_allow)
            and self.approval_rule(tool) != "never"
        )

    def needs_approval(self, tool: str) -> bool:
        return self.allows(tool) and self.approval_rule(tool) == "ask"

    def with_tool_rules(self, rules: Mapping[str, ApprovalRule]) -> RunPolicy:
        """The policy with approval rules for tools it does not name (an MCP server's own
        `require_approval`): what the policy names wins."""
        if not rules:
            return self
        approval = self.tool_approval or ToolApproval()
        named = {**rules, **approval.tools}
        return self.model_copy(
            update={"tool_approval": approval.model_copy(update={"tools": named})}
        )

    def approval_rule(self, tool: str) -> ApprovalRule:
        """always, ask or never: the tool's rule, "always" when no approval policy is set."""
        return self.tool_approval.rule(tool) if self.tool_approval is not None else "always"


def merged(*layers: Mapping[str, Any] | None) -> RunPolicy:
    """Session config < ask: later layers' fields win."""
    fields: dict[str, Any] = {}
    for layer in layers:
        fields |= {k: v for k, v in (layer or {}).items() if v is not None}
    return RunPolicy.model_validate(fields)


def violation_before_ask(
    policy: RunPolicy, runs_so_far: int, tokens_so_far: int
) -> tuple[str, str] | None:
    """(rule, message) if the ask must be refused before anything is written."""
    if policy.max_turns is not None and runs_so_far >= policy.max_turns:
        return "max_turns", f"the session has had its {policy.max_turns} turns"
    if policy.max_total_tokens is not None and tokens_so_far >= policy.max_total_tokens:
        return (
            "max_total_tokens",
            f"the session has used {tokens_so_far} of its {policy.max_total_tokens} tokens",
        )
    return None
