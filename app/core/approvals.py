"""Tool approval: which calls wait for a person, and what the model reads for each ruling."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# always: the call runs at once; ask: it waits for a person's ruling; never: the tool is not
# offered to the model, and a call of it is refused.
ApprovalRule = Literal["always", "ask", "never"]
# How a call that waited was settled (None while it waits).
Decision = Literal["approved", "rejected", "expired"]


class ToolApproval(BaseModel):
    """The approval rule of each tool: named ones, and a default for the others."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    default: ApprovalRule = Field(
        default="always", description="The rule of every tool not named in `tools`."
    )
    tools: dict[str, ApprovalRule] = Field(
        default_factory=dict, description="The rule of each tool named here, by tool name."
    )

    def rule(self, tool: str) -> ApprovalRule:
        return self.tools.get(tool, self.default)


def rejected_text(reason: str | None) -> str:
    """The tool result the model reads for a call a person rejected."""
    said = f" Their reason: {reason}" if reason else ""
    return f"The user rejected this tool call; it was not run.{said}"


EXPIRED_TEXT = "Nobody approved this tool call in time; it was not run."
# An approved call is run at most once: if the worker running it stopped before its result
# was committed, the retried run does not start it again, and the model reads this.
INTERRUPTED_TEXT = (
    "This approved tool call was started, but the worker running it stopped before it "
    "returned; it was not run again, so whether it took effect is unknown."
)


def edited_note(arguments: dict[str, Any]) -> str:
    """Put before the result of a call a person approved with other arguments: the journal
    keeps the model's call as it made it, so the model learns what actually ran."""
    edited = json.dumps(arguments)
    return f"The user edited the arguments before approving; the tool ran with {edited}.\n\n"
