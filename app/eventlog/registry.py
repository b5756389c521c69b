"""The run event registry: every run event type, declared once, with the model of its payload.

A run event is `(run_id, seq, type, data)`: `data` is the JSON payload that clients receive as
an SSE event's `data:`. Each type below has one pydantic model of that payload (its docstring
says when the event is sent, its fields what they mean); every surface maps these to its own
wire shape in one place (the native SSE stream and its OpenAPI description: app/api/sse.py).

Payload conventions: a field with a default is omitted when it does not apply and is never
null; a field that may be null is always sent. Unknown fields are refused, so that a payload
that drifts from its model fails the tests rather than surprising clients.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from enum import StrEnum
from typing import Any, ClassVar, Literal, Self, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.json_schema import SkipJsonSchema

from app.core.entries import EntryKind, FinishReason


class EventType(StrEnum):
    """The type of a run event (its SSE `event:`), in the order a run may emit them."""

    RUN_CREATED = "run.created"
    RUN_STARTED = "run.started"
    MESSAGE_RESET = "message.reset"
    CONTEXT_WARNING = "context.warning"
    CONTEXT_COMPACTING = "context.compacting"
    CONTEXT_COMPACTION_PROGRESS = "context.compaction_progress"
    CONTEXT_COMPACTED = "context.compacted"
    CONTEXT_COMPACTION_FAILED = "context.compaction_failed"
    CONTEXT_COMPACTION_PENDING = "context.compaction_pending"
    RUN_STEERED = "run.steered"
    REASONING_DELTA = "reasoning.delta"
    MESSAGE_DELTA = "message.delta"
    TOOL_CALL_DELTA = "tool_call.delta"
    TOOL_CALL = "tool_call"
    TOOL_RESULT = "tool_result"
    ENTRY_COMMITTED = "entry.committed"
    RUN_REQUIRES_ACTION = "run.requires_action"
    TOOL_APPROVAL_REQUESTED = "tool.approval_requested"
    RUN_AWAITING_APPROVAL = "run.awaiting_approval"
    TOOL_APPROVAL_ANSWERED = "tool.approval_answered"
    USAGE = "usage"
    RUN_COMPLETED = "run.completed"
    RUN_FAILED = "run.failed"
    RUN_CANCELLED = "run.cancelled"


Event = tuple[EventType, dict[str, Any]]  # (type, payload): an event as a run emits it


# Exactly one of these ends every run, and with it every stream of the run.
TerminalEvent = Literal[EventType.RUN_COMPLETED, EventType.RUN_FAILED, EventType.RUN_CANCELLED]
TERMINAL_EVENTS: frozenset[EventType] = frozenset(get_args(TerminalEvent))
# The terminal event of a run that ends with this status.
TERMINAL_BY_STATUS: Mapping[str, TerminalEvent] = {
    "completed": EventType.RUN_COMPLETED,
    "failed": EventType.RUN_FAILED,
    "cancelled": EventType.RUN_CANCELLED,
}

# Why a run was asked to stop: POST /cancel (or a client gone with on_disconnect: cancel), or a
# later ask's multitask_strategy.
CancelMode = Literal["cancel", "interrupt", "rollback"]

# A field sent only when it applies: `name: str | Omitted = sometimes("...")`. In the JSON
# schema it is optional and not nullable; an explicit null is refused.
Omitted = SkipJsonSchema[None]


def _no_default(schema: dict[str, Any]) -> None:
    schema.pop("default", None)  # absent, not null: a null default would say otherwise


def sometimes(description: str) -> Any:
    """A field that is omitted when it does not apply (never null)."""
    return Field(default=None, description=description, json_schema_extra=_no_default)


class _Payload(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    @model_validator(mode="after")
    def _omitted_never_null(self) -> Self:
        for name in self.model_fields_set:
            field = type(self).model_fields[name]
            if field.json_schema_extra is _no_default and getattr(self, name) is None:
                raise ValueError(f"{name}: omitted when it does not apply, never null")
        return self

    def as_dict(self) -> dict[str, Any]:
        """The JSON payload: the fields that were given (those that do not apply stay out)."""
        return self.model_dump(mode="json", exclude_unset=True)


class EventData(_Payload):
    """The payload of one run event type."""

    event_type: ClassVar[EventType]


# --- Types the payloads share ----------------------------------------------------------


class EventError(_Payload):
    """What went wrong, in the shape of the API's errors."""

    code: str = Field(
        description="Stable and machine-readable: `provider_<kind>` for a failed model call "
        "(`provider_rate_limit`, `provider_overloaded`, `provider_server`, "
        "`provider_bad_request`, `provider_auth`, ...), `policy_violation`, "
        "`tool_outputs_timeout`, `context_overflow`, `nothing_to_compact`, "
        "`compaction_superseded`, `internal_error`, ..."
    )
    message: str = Field(description="For people: what happened.")
    rule: str | Omitted = sometimes(
        "`policy_violation` only: the `run_policy` limit the run broke (`max_iterations`, "
        "`max_total_tokens`, `max_run_seconds`, `tool_denied`, ...)."
    )


class TokenUsage(_Payload):
    """Tokens a run spent, summed over its model calls (a summarizer's included)."""

    input_tokens: int = Field(description="Prompt tokens, cached ones included.")
    output_tokens: int = Field(description="Tokens the model generated.")
    cached_tokens: int = Field(description="Prompt tokens served from the provider's cache.")
    cache_write_tokens: int = Field(
        default=0,
        description="Prompt tokens written to the provider's cache (Anthropic reports them; "
        "they cost more than other input).",
    )
    estimated: bool = Field(
        description="True when the provider reported no usage and the service counted the "
        "tokens with its tokenizer."
    )
    reasoning_tokens: int | Omitted = sometimes(
        "Of the output, tokens the model reasoned with, where the provider reports them "
        "(OpenAI's reasoning models)."
    )


class PendingToolCall(_Payload):
    """A tool call the client must run (a client-side tool)."""

    tool_call_id: str = Field(description="Send it back with the call's output.")
    name: str = Field(description="The tool's name, as declared in the session's tools.")
    arguments: dict[str, Any] = Field(description="The arguments the model gave, parsed.")


# --- The payloads, one per event type ---------------------------------------------------


class RunCreatedData(EventData):
    """First event of every run: the ask (or compaction) was committed and the run queued."""

    event_type = EventType.RUN_CREATED
    run_id: str = Field(
        description="The run's id, for `/v1/runs/{id}` (status, events, cancel, tool outputs)."
    )
    session_id: str = Field(description="The session the run belongs to.")
    kind: Literal["ask", "compaction"] = Field(
        description="`ask`: answers a user entry; `compaction`: appends a summary checkpoint."
    )
    user_entry_seq: int | None = Field(
        description="The seq of the user entry the run answers; null for a compaction."
    )
    model: str = Field(description="The model asked to answer, e.g. `openai:gpt-4o-mini`.")


class RunStartedData(EventData):
    """A worker took the run and starts (or, after a worker crash, restarts) it."""

    event_type = EventType.RUN_STARTED
    attempt: int = Field(description="1 for the first attempt; more after a worker died.")


class MessageResetData(EventData):
    """Discard the text and tool calls the model turn streamed so far: it starts over."""

    event_type = EventType.MESSAGE_RESET
    reason: Literal["retry", "provider_retry"] = Field(
        description="Why: `retry`, the run starts over from its journal (its worker died, or "
        "the database was lost meanwhile); `provider_retry`, the model call failed after its "
        "output began and is asked again."
    )
    attempt: int = Field(description="The run's attempt (a new one after a worker died).")


# context.warning's levels, as shares of the context policy's input budget.
APPROACHING_LIMIT_SHARE, AT_LIMIT_SHARE = 0.8, 1.0


class ContextWarningData(EventData):
    """Before a model call whose context is 80% full or more (or no longer holds the whole
    history), before any compaction; or (level `tools_left_out`) when a run starts without
    some of its MCP tools (a server unreachable, a schema no model can take)."""

    event_type = EventType.CONTEXT_WARNING
    level: Literal["approaching_limit", "at_limit", "tools_left_out"] = Field(
        description="`approaching_limit` from 80% of the budget; `at_limit` at 100%, or once "
        "the history no longer fits whole; `tools_left_out`: see `message`."
    )
    tokens: int | None = Field(
        default=None, description="The context's estimated tokens (context levels)."
    )
    budget: int | None = Field(
        default=None, description="The input token budget of the context policy (context levels)."
    )
    percent: float | None = Field(
        default=None, description="tokens / budget, in percent (one decimal; context levels)."
    )
    history_dropped: bool | None = Field(
        default=None,
        description="Older history had to be left out of the context (windowing; context levels).",
    )
    message: str | None = Field(
        default=None, description="What was left out and why (`tools_left_out`)."
    )


class ContextCompactingData(EventData):
    """A summarizer is called to compact the history into a checkpoint: by a compaction run
    (`POST /v1/sessions/{id}/compact`), or by an ask whose context is full (context policy
    `summarization: auto`)."""

    event_type = EventType.CONTEXT_COMPACTING
    reason: Literal["auto", "requested"] = Field(
        description="`auto`: an ask's full context; `requested`: a compaction run."
    )
    from_seq: int = Field(description="The first seq the summary will cover.")
    to_seq: int = Field(description="The last seq it will cover; later entries stay raw.")
    entries: int = Field(description="How many entries are summarized.")
    kept_turns: int = Field(description="Turns left raw after to_seq.")
    tokens: int | None = Field(
        description="The context's tokens before compacting (null if it cannot be projected)."
    )
    model: str = Field(description="The summarization model.")
    focus: str | None = Field(description="What the summary concentrates on, if asked.")


class ContextCompactionProgressData(EventData):
    """A compaction run's summarizer is writing (after `context.compacting`): sent as each
    summarizer call starts and about once a second while it writes, so a slow model shows
    progress."""

    event_type = EventType.CONTEXT_COMPACTION_PROGRESS
    call: int = Field(description="The summarizer call under way, from 1: one per chunk.")
    calls: int = Field(description="How many calls the compaction makes.")
    chars: int = Field(description="Characters of summary this call has written so far.")


class ContextCompactedData(EventData):
    """The summary checkpoint was committed (after its `entry.committed`); the context now
    starts from it."""

    event_type = EventType.CONTEXT_COMPACTED
    reason: Literal["auto", "requested"] = Field(
        description="`auto`: an ask's full context; `requested`: a compaction run."
    )
    summary_seq: int = Field(description="The seq of the new summary entry.")
    from_seq: int = Field(description="The first seq the summary covers.")
    to_seq: int = Field(description="The last seq it covers.")
    tokens_before: int | None = Field(description="The context's tokens before (null: unknown).")
    tokens_after: int | None = Field(description="The context's tokens now (null: unknown).")
    summary_tokens: int = Field(description="The summary's own tokens.")
    model: str = Field(description="The model that wrote the summary.")
    calls: int = Field(description="Summarizer calls made: one per transcript chunk.")
    cut: bool = Field(description="The summary was over its cap and was cut, with a mark.")


class ContextCompactionFailedData(EventData):
    """A compaction failed and nothing was committed: the model failed, or its summary was
    refused (`summary_not_shorter`: no shorter than the history it would replace, by the
    reading model's count; `summary_echoes_prompt`: prompt text or role markers in it). The
    session goes on with the windowed context (the newest history that fits); an ask goes on
    answered from it, a compaction run then ends `run.failed` with the same error."""

    event_type = EventType.CONTEXT_COMPACTION_FAILED
    error: EventError = Field(description="Why the compaction failed.")
    fallback: Literal["windowing"] = Field(description="How the session goes on: `windowing`.")


class ContextCompactionPendingData(EventData):
    """A compaction outlasted the policy's `compaction_wait_seconds`: the ask goes on,
    answered from the windowed context, while the summary is still written for later asks.
    Either the ask's own auto-compaction (`from_seq`, `to_seq`) or a compaction job queued
    before the ask (`run_id`)."""

    event_type = EventType.CONTEXT_COMPACTION_PENDING
    waited_seconds: float = Field(description="How long the ask waited for it.")
    fallback: Literal["windowing"] = Field(description="How the ask goes on: `windowing`.")
    from_seq: int | Omitted = sometimes("An auto-compaction's: the first seq it covers.")
    to_seq: int | Omitted = sometimes("An auto-compaction's: the last seq it covers.")
    run_id: str | Omitted = sometimes("A compaction job's: the run writing the summary.")

    @model_validator(mode="after")
    def _one_compaction(self) -> Self:
        given = (self.from_seq is not None, self.to_seq is not None, self.run_id is not None)
        if given not in {(True, True, False), (False, False, True)}:
            raise ValueError("either from_seq and to_seq (auto-compaction) or run_id (a job)")
        return self


class RunSteeredData(EventData):
    """A message sent while the run worked (an ask with `multitask_strategy: steer`) landed in
    the journal: at the start of a model turn of this run (`iteration`: after every tool result
    of the turn before, so the model sees it next), or, when the run ended before its next model
    turn, as the input of the run that answers it (`next_run_id`); a cancelled run's steer is
    kept as a message and starts nothing."""

    event_type = EventType.RUN_STEERED
    steer_id: str = Field(description="The steer (the ask's `Threadline-Steer-Id` header).")
    entry_seq: int = Field(description="The user message's seq in the session's journal.")
    iteration: int | Omitted = sometimes(
        "Delivered to this run: the model turn (1 = the run's first) that sees the message."
    )
    next_run_id: str | Omitted = sometimes(
        "The run ended first: the run that the message starts (stream it by its id)."
    )
    text: str | Omitted = sometimes("The message's text (its text parts, joined).")


class ReasoningDeltaData(EventData):
    """A piece of the model's reasoning (its thinking before it answers, when the ask's
    `reasoning` is on), as the model thinks it: not part of the answer. Pieces with the same
    `index` are one reasoning block of the model turn, between its `start` and its `end`
    (deltas of a block that arrive close together are sent as one). Kept in the journal as
    parts of the assistant message, once the model turn completes."""

    event_type = EventType.REASONING_DELTA
    index: int = Field(
        description="The block of the model turn the piece belongs to (the provider's "
        "content block index; a turn's text and tool calls have their own)."
    )
    text: str = Field(
        description="Reasoning text to append to the block (empty for a block's boundary "
        "or a redacted block)."
    )
    start: Literal[True] | Omitted = sometimes("The block's first piece.")
    end: Literal[True] | Omitted = sometimes("The block is complete.")
    redacted: Literal[True] | Omitted = sometimes(
        "The provider encrypted this block's reasoning: it has no text to show."
    )


class MessageDeltaData(EventData):
    """A piece of the assistant's answer, as the model writes it (deltas that arrive close
    together are sent as one)."""

    event_type = EventType.MESSAGE_DELTA
    text: str = Field(description="Text to append to the answer so far.")


class ToolCallDeltaData(EventData):
    """A piece of a tool call, as the model writes it."""

    event_type = EventType.TOOL_CALL_DELTA
    index: int = Field(description="Which call of the model turn the piece belongs to.")
    tool_call_id: str | Omitted = sometimes("The call's id (the first piece of each call).")
    name: str | Omitted = sometimes("The tool's name (in the piece the model named it).")
    arguments: str = Field(description="A fragment of the arguments' JSON text, to append.")


class ToolCallData(EventData):
    """A tool call is about to run in the service (a built-in or webhook tool)."""

    event_type = EventType.TOOL_CALL
    tool_call_id: str = Field(
        description="The call's id: `call_<user entry seq>_<model turn>_<place in the turn>`."
    )
    name: str = Field(description="The tool's name.")
    arguments: dict[str, Any] = Field(description="The arguments the model gave, parsed.")


class ToolResultData(EventData):
    """A tool call run by the service returned (its result is committed right after)."""

    event_type = EventType.TOOL_RESULT
    tool_call_id: str = Field(description="The call this is the result of.")
    name: str = Field(description="The tool's name.")
    is_error: bool = Field(description="The tool failed, timed out or was refused by policy.")
    preview: str = Field(description="The result as the model reads it, its first 500 chars.")


class EntryCommittedData(EventData):
    """An entry was appended to the session's journal by the run (its answer, tool calls and
    results, summary, usage, `run_end`, ...)."""

    event_type = EventType.ENTRY_COMMITTED
    seq: int = Field(description="The entry's seq in the session.")
    kind: EntryKind = Field(description="The entry's kind.", strict=False)
    id: str = Field(description="The entry's id.")


class RunRequiresActionData(EventData):
    """The run waits for the client to run these client-side tool calls: post their outputs
    to `/v1/runs/{id}/tool_outputs` and the run resumes."""

    event_type = EventType.RUN_REQUIRES_ACTION
    tool_calls: list[PendingToolCall] = Field(
        min_length=1, description="The calls to answer, one output each."
    )
    expires_at: str = Field(
        json_schema_extra={"format": "date-time"},
        description="When the run fails with `tool_outputs_timeout` if no outputs arrived.",
    )


class ToolApprovalRequestedData(EventData):
    """A tool call waits for a person's approval (its tool's rule is `ask`): answer it with
    `POST /v1/runs/{id}/approvals` (approve, approve with edited arguments, or reject)."""

    event_type = EventType.TOOL_APPROVAL_REQUESTED
    tool_call_id: str = Field(description="The call to rule on.")
    name: str = Field(description="The tool's name.")
    arguments: dict[str, Any] = Field(description="The arguments the model gave, parsed.")
    expires_at: str = Field(
        json_schema_extra={"format": "date-time"},
        description="When an unanswered call counts as rejected (the model reads that nobody "
        "approved it in time).",
    )


class RunAwaitingApprovalData(EventData):
    """Every approval request of this step is out: the run waits, holding no worker, until
    each is answered (or expires); then it resumes."""

    event_type = EventType.RUN_AWAITING_APPROVAL
    tool_call_ids: list[str] = Field(min_length=1, description="The calls that wait.")
    expires_at: str = Field(
        json_schema_extra={"format": "date-time"},
        description="When the unanswered ones count as rejected.",
    )


class ToolApprovalAnsweredData(EventData):
    """A waiting call was ruled on (or expired); the run resumes once every call is."""

    event_type = EventType.TOOL_APPROVAL_ANSWERED
    tool_call_id: str = Field(description="The call ruled on.")
    name: str = Field(description="The tool's name.")
    decision: Literal["approved", "rejected", "expired"] = Field(
        description="`approved`: it runs (once); `rejected` or `expired`: it does not, and the "
        "model reads why as its result."
    )
    arguments: dict[str, Any] | Omitted = sometimes(
        "The arguments it runs with, when the person edited them."
    )
    reason: str | Omitted = sometimes("A rejection's reason, as the model reads it.")


class UsageData(EventData):
    """What the run spent, just before its terminal event (when the provider or the
    tokenizer gave counts)."""

    event_type = EventType.USAGE
    input_tokens: int = Field(description="Prompt tokens, cached ones included.")
    output_tokens: int = Field(description="Tokens the model generated.")
    cached_tokens: int = Field(description="Prompt tokens served from the provider's cache.")
    cache_write_tokens: int = Field(
        default=0,
        description="Prompt tokens written to the provider's cache (Anthropic reports them; "
        "they cost more than other input).",
    )
    estimated: bool = Field(
        description="True when the provider reported no usage and the service counted them."
    )
    reasoning_tokens: int | Omitted = sometimes(
        "Of the output, tokens the model reasoned with, where the provider reports them "
        "(OpenAI's reasoning models)."
    )
    cost_usd: float | None = Field(description="The price in USD (null: the model's is unknown).")


class RunCompletedData(EventData):
    """Terminal: the run ended with an answer (for a compaction, the summary)."""

    event_type = EventType.RUN_COMPLETED
    run_id: str = Field(description="The run's id.")
    status: Literal["completed"] = Field(description="The run's final status.")
    model: str = Field(description="The model that answered (a fallback model, maybe).")
    text: str = Field(description="The whole answer (a compaction's summary).")
    usage: TokenUsage | None = Field(description="Tokens spent (null: none were reported).")
    finish_reason: FinishReason | None = Field(
        description="Why the model stopped: `stop` (complete), `length` (cut off by "
        "`max_output_tokens`), `tool_calls`, `content_filter`, `other`; null for a compaction."
    )


class RunFailedData(EventData):
    """Terminal: the run failed (the model call, a policy limit, a client that never sent
    tool outputs, ...); what the model had said is committed, marked incomplete."""

    event_type = EventType.RUN_FAILED
    run_id: str = Field(description="The run's id.")
    status: Literal["failed"] = Field(description="The run's final status.")
    model: str = Field(description="The model that was answering.")
    partial_text: str = Field(description="The answer received before the failure.")
    error: EventError = Field(description="Why the run failed.")
    reason: CancelMode | Omitted = sometimes(
        "The cancel that was requested while the run failed anyway."
    )


class RunCancelledData(EventData):
    """Terminal: the run was stopped; what the model had said is committed, marked
    incomplete."""

    event_type = EventType.RUN_CANCELLED
    run_id: str = Field(description="The run's id.")
    status: Literal["cancelled"] = Field(description="The run's final status.")
    model: str = Field(description="The model that was answering.")
    partial_text: str = Field(description="The answer received before the cancel.")
    reason: CancelMode = Field(
        description="`cancel`: `POST /v1/runs/{id}/cancel` (or the client left, with "
        "`on_disconnect: cancel`); `interrupt` or `rollback`: a later ask's "
        "`multitask_strategy`."
    )


# The registry: each event type's payload model, in EventType's order.
PAYLOADS: Mapping[EventType, type[EventData]] = {
    model.event_type: model
    for model in (
        RunCreatedData,
        RunStartedData,
        MessageResetData,
        ContextWarningData,
        ContextCompactingData,
        ContextCompactionProgressData,
        ContextCompactedData,
        ContextCompactionFailedData,
        ContextCompactionPendingData,
        RunSteeredData,
        ReasoningDeltaData,
        MessageDeltaData,
        ToolCallDeltaData,
        ToolCallData,
        ToolResultData,
        EntryCommittedData,
        RunRequiresActionData,
        ToolApprovalRequestedData,
        RunAwaitingApprovalData,
        ToolApprovalAnsweredData,
        UsageData,
        RunCompletedData,
        RunFailedData,
        RunCancelledData,
    )
}


class UnknownEventType(ValueError):
    def __init__(self, event_type: str) -> None:
        super().__init__(f"not a run event type: {event_type!r}")


def parse(event_type: str, data: Mapping[str, Any]) -> EventData:
    """The payload of an event of this type, validated (pydantic's ValidationError if it does
    not match its model; UnknownEventType for a type the registry lacks)."""
    try:
        model = PAYLOADS[EventType(event_type)]
    except ValueError:
        raise UnknownEventType(event_type) from None
    return model.model_validate(data)


def encode(payload: EventData) -> tuple[EventType, dict[str, Any]]:
    """An event as it is stored and sent: its type and its JSON payload."""
    return payload.event_type, payload.as_dict()


# --- The reference table (README) -------------------------------------------------------


def markdown_table() -> str:
    """The run events as a markdown table (event, when it is sent, its `data:` fields), made
    from the registry: the README's section between its events markers is this text."""
    lines = [
        "`name?`: a field left out when it does not apply (never null). "
        "`a.b`: field `b` of object `a`; `a[].b`: of each item of array `a`.",
        "",
        "| event | sent when | `data` |",
        "|---|---|---|",
    ]
    for event_type, model in PAYLOADS.items():
        schema = model.model_json_schema(mode="serialization")
        fields = "<br>".join(_fields(schema, schema.get("$defs", {}), ""))
        lines.append(f"| `{event_type}` | {_cell(schema['description'])} | {fields} |")
    return "\n".join(lines) + "\n"


def _fields(schema: dict[str, Any], defs: dict[str, Any], prefix: str) -> list[str]:
    lines = []
    required = schema.get("required", [])
    for name, prop in schema["properties"].items():
        path = f"{prefix}{name}{'' if name in required else '?'}"
        lines.append(f"`{path}` {_type(prop, defs)}: {_cell(prop['description'])}")
        for nested, suffix in _objects(prop, defs):
            lines += _fields(nested, defs, f"{prefix}{name}{suffix}.")
    return lines


def _objects(prop: dict[str, Any], defs: dict[str, Any]) -> list[tuple[dict[str, Any], str]]:
    """The object models a field holds (itself, or its array's items), with the path suffix."""
    found = []
    for option in prop.get("anyOf", [prop]):
        target, suffix = option, ""
        if option.get("type") == "array":
            target, suffix = option["items"], "[]"
        if "$ref" in target:
            model = defs[target["$ref"].rsplit("/", 1)[-1]]
            if "properties" in model:
                found.append((model, suffix))
    return found


def _type(prop: dict[str, Any], defs: dict[str, Any]) -> str:
    if "anyOf" in prop:
        return r" \| ".join(_type(option, defs) for option in prop["anyOf"])
    if "$ref" in prop:
        target = defs[prop["$ref"].rsplit("/", 1)[-1]]
        return "object" if "properties" in target else _type(target, defs)
    if "const" in prop:
        return f"`{json.dumps(prop['const'])}`"
    if "enum" in prop:
        return r" \| ".join(f'`"{value}"`' for value in prop["enum"])
    if prop.get("type") == "array":
        return f"array of {_type(prop['items'], defs)}"
    kind = str(prop.get("type", "any JSON"))
    return f"{kind} ({prop['format']})" if "format" in prop else kind


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", r"\|")
