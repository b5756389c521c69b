"""ContextPolicy: how a journal is projected into a model's context; presets and resolution."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, get_origin

from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator

Kind = Literal["message", "tool_call", "tool_result", "summary"]
ALL_KINDS: tuple[Kind, ...] = ("message", "tool_call", "tool_result", "summary")
DEFAULT_CONTEXT_WINDOW = 200_000
DEFAULT_EVICTION_TOKENS = 20_000


class ContextPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    max_input_tokens: Annotated[int, Field(ge=64, le=10_000_000)] = Field(
        default=8000, description="The context window the projection must fit, output included."
    )
    reserve_output_tokens: Annotated[int, Field(ge=0, le=10_000_000)] | None = Field(
        default=None,
        description="Kept free for the answer: budget = max_input - reserve. Default: a quarter "
        "of max_input_tokens, at most 32,000.",
    )
    max_messages: Annotated[int, Field(ge=0, le=1_000_000)] = Field(
        default=0, description="Most history messages sent (0: no limit)."
    )
    keep_last_turns: Annotated[int, Field(ge=0, le=10_000)] = Field(
        default=3,
        description=(
            "The newest turns windowing never drops while they fit, and compaction never "
            "summarizes."
        ),
    )
    summarization: Literal["none", "use_existing", "auto"] = Field(
        default="auto",
        description="none: ignore summaries; use_existing: the latest summary is a checkpoint, "
        "only POST /compact writes one; auto: also compact before a model call once the "
        "context reaches compress_threshold or history no longer fits.",
    )
    compaction_wait_seconds: Annotated[float, Field(ge=0, le=3600)] = Field(
        default=10.0,
        description="The longest an ask waits for a compaction (its run's automatic one, or a "
        "compaction job queued before it); past it, the ask is answered from windowing and "
        "the compaction goes on in the background (its summary serves later asks).",
    )
    summary_role: Literal["system", "user"] = "system"
    include_kinds: tuple[Kind, ...] = Field(
        default=ALL_KINDS, description="Entry kinds the model may see."
    )
    system_prompt: str | None = Field(
        default=None, description="Overrides the session's system prompt when set."
    )
    token_estimator: Literal["exact", "heuristic"] = Field(
        default="exact",
        description="exact: the model's tokenizer (an estimate with margin for non-OpenAI "
        "models); heuristic: four characters per token.",
    )
    estimate_margin: Annotated[float, Field(ge=0, le=1)] = Field(
        default=0.1, description="Safety margin on estimated counts (non-OpenAI or heuristic)."
    )
    compress_threshold: Annotated[float, Field(gt=0, le=1)] = Field(
        default=0.9, description="needs_summary once the projection uses this share of budget."
    )
    tool_output_eviction_tokens: Annotated[int, Field(ge=1)] | None = Field(
        default=None,
        description="Tool results above this are projected as a preview plus a reference "
        "that read_tool_output pages. Default: 20,000, or a quarter of the budget if smaller "
        "(so one output can never crowd out a small window).",
    )
    window_chunk_tokens: Annotated[int, Field(ge=0)] | None = Field(
        default=None,
        description="When history must be dropped, drop enough that up to this many tokens of "
        "the budget are free, and keep that window's start on the following asks until it no "
        "longer fits, so consecutive prompts share their prefix (prompt caches). Default: the "
        "largest power of two at most the budget (a truncated window then leaves at most about "
        "half to two thirds of the budget unused; set a smaller chunk for fuller windows and "
        "fewer cache hits); 0: slide by one group. A window never leaves more than one chunk of "
        "the budget unused unless no turn start uses more.",
    )

    @model_validator(mode="after")
    def _room_for_input(self) -> ContextPolicy:
        if self.reserve >= self.max_input_tokens:
            raise ValueError("reserve_output_tokens must be smaller than max_input_tokens")
        if "message" not in self.include_kinds:
            # Without messages the run's own question is left out: the model would be sent an
            # empty history (the ask's dry run, which adds it as pending, would not notice).
            raise ValueError("include_kinds must include message: the newest turn is always sent")
        return self

    @property
    def reserve(self) -> int:
        if self.reserve_output_tokens is not None:
            return self.reserve_output_tokens
        return min(self.max_input_tokens // 4, 32_000)

    @property
    def budget(self) -> int:
        """Tokens the prompt may use."""
        return self.max_input_tokens - self.reserve

    @property
    def eviction_tokens(self) -> int:
        if self.tool_output_eviction_tokens is not None:
            return self.tool_output_eviction_tokens
        return max(1, min(DEFAULT_EVICTION_TOKENS, self.budget // 4))

    @property
    def chunk_tokens(self) -> int:
        """window_chunk_tokens, else default_chunk(budget)."""
        if self.window_chunk_tokens is not None:
            return self.window_chunk_tokens
        return default_chunk(self.budget)


# The default chunk: the largest power of two at most the budget. A window jumps about once per
# chunk of thread growth, so a large chunk keeps the prompt prefix (and a provider's prompt
# cache) across many asks. A larger budget never sends less history, so near the bottom of a
# level (a budget just past a power of two) the window holds at least what the level below
# holds; in all, a truncated window leaves at most about half the budget unused, two thirds at
# a level's middle. A power of two, so that the chunk changes only where the budget crosses a
# level, not with every change of it.


def default_chunk(budget: int) -> int:
    """The default chunk of a budget: the largest power of two <= budget."""
    return 1 << (max(1, budget).bit_length() - 1)


def largest_budget_with_chunk(chunk: int) -> int:
    """The largest budget whose default chunk is `chunk` (a power of two)."""
    return 2 * chunk - 1


PRESETS: dict[str, dict[str, Any]] = {
    "short_context": {"max_input_tokens": 6000, "keep_last_turns": 2},
    "long_context": {"max_input_tokens": 100_000, "keep_last_turns": 10, "max_messages": 0},
    "tool_focused": {
        "keep_last_turns": 5,
        "include_kinds": ("message", "tool_call", "tool_result"),
        "summarization": "none",
    },
}


def for_model(context_window: int) -> dict[str, Any]:
    """Policy fields for a model with this context window (looked up by the caller)."""
    return {"max_input_tokens": context_window}


def _optional(name: str) -> Any:
    info = ContextPolicy.model_fields[name]
    annotation: Any = info.annotation
    constrained = Annotated[(annotation, *info.metadata)] if info.metadata else annotation
    # The patch is strict, except that a JSON array is a tuple (strict wants a Python tuple).
    lax: dict[str, Any] = {"strict": False} if get_origin(annotation) is tuple else {}
    return (constrained | None, Field(default=None, description=info.description, **lax))


Preset = Literal["short_context", "long_context", "tool_focused"]
_patch_fields: dict[str, Any] = {name: _optional(name) for name in ContextPolicy.model_fields}
_patch_fields["preset"] = (Preset | None, Field(default=None, description="Start from a preset."))

# A partial policy, as sessions and requests give it: every field optional, same constraints,
# plus a preset to start from.
ContextPolicyPatch: type[BaseModel] = create_model(
    "ContextPolicyPatch", __config__=ConfigDict(extra="forbid", strict=True), **_patch_fields
)


def resolve(*layers: Mapping[str, Any] | None) -> ContextPolicy:
    """Merge policy layers, lowest priority first: server default, session, request.

    Each layer is a partial policy; a `preset` key in a layer expands to that preset's fields
    under the layer's own explicit ones. Raises pydantic.ValidationError naming the field.
    """
    merged: dict[str, Any] = {}
    for layer in layers:
        if not layer:
            continue
        fields = dict(layer)
        preset = fields.pop("preset", None)
        if preset is not None:
            merged.update(PRESETS[preset])
        merged.update({k: v for k, v in fields.items() if v is not None})
    return ContextPolicy.model_validate(merged)
