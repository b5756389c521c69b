"""The reasoning setting (a model thinking before it answers): effort or token budget, how a
session's and an ask's combine, and the budget each effort stands for."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

Effort = Literal["none", "low", "medium", "high"]
# Anthropic's extended thinking takes at least 1024 budget tokens.
MIN_BUDGET_TOKENS = 1024
MAX_BUDGET_TOKENS = 128_000
# The thinking budget each effort stands for where a provider takes a budget (Anthropic).
EFFORT_BUDGETS: Mapping[str, int] = {"low": 1024, "medium": 4096, "high": 16384}
# The answer's cap where a provider needs one (Anthropic's max_tokens) and the ask sets none;
# with reasoning, the thinking budget comes on top of it.
DEFAULT_ANSWER_TOKENS = 4096


class Reasoning(BaseModel):
    """Let the model think before it answers: an effort, or a token budget for its thinking."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    effort: Effort | None = Field(
        default=None,
        description="low, medium or high (Anthropic: a thinking budget of "
        f"{EFFORT_BUDGETS['low']}, {EFFORT_BUDGETS['medium']} or {EFFORT_BUDGETS['high']} "
        "tokens); none: no reasoning (turns off a session's setting for one ask).",
    )
    budget_tokens: Annotated[int, Field(ge=MIN_BUDGET_TOKENS, le=MAX_BUDGET_TOKENS)] | None = Field(
        default=None, description="The most tokens the model may think with."
    )

    @model_validator(mode="after")
    def _one_of(self) -> Self:
        if (self.effort is None) == (self.budget_tokens is None):
            raise ValueError("give effort or budget_tokens (one of them)")
        return self

    @property
    def enabled(self) -> bool:
        return self.effort != "none"

    @property
    def budget(self) -> int:
        """The thinking budget in tokens (an effort's, or the one given)."""
        if self.budget_tokens is not None:
            return self.budget_tokens
        return EFFORT_BUDGETS.get(self.effort or "", 0)


def effort_of(reasoning: Reasoning) -> str:
    """The effort asked of a provider that takes an effort, not a budget (OpenAI): the one
    given, or the least whose budget covers the given budget (high beyond its budget)."""
    if reasoning.effort is not None:
        return reasoning.effort
    for effort, budget in EFFORT_BUDGETS.items():
        if reasoning.budget <= budget:
            return effort
    return "high"


def effective(session: Mapping[str, Any] | None, ask: Mapping[str, Any] | None) -> Reasoning | None:
    """The reasoning a run uses: the ask's setting if it has one, else the session's; None when
    off. Both are stored JSON, validated when they were accepted."""
    chosen = ask if ask is not None else session
    if chosen is None:
        return None
    reasoning = Reasoning.model_validate(dict(chosen))
    return reasoning if reasoning.enabled else None


def output_room(reasoning: Reasoning | None, max_output_tokens: int | None) -> int:
    """Tokens a model turn may write when it reasons: its thinking budget and the answer's cap
    (the default one when unset); 0 without reasoning. A projection keeps at least this much
    of the window free, or the provider refuses the request (prompt + max_tokens > window)."""
    if reasoning is None:
        return 0
    return reasoning.budget + (max_output_tokens or DEFAULT_ANSWER_TOKENS)


def unsupported(model: str) -> str:
    """Why an ask with reasoning on cannot go to `model` (one that cannot reason)."""
    return (
        f"{model} cannot reason: ask another model, or turn reasoning off "
        '(reasoning: {"effort": "none"}, or no reasoning in the session\'s config)'
    )
