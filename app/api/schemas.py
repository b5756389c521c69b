"""Request and response bodies of the HTTP API (what the OpenAPI document describes)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    model_validator,
)
from sqlalchemy import RowMapping

from app.core import metadata as metadata_rules
from app.core import runs, sessions
from app.core.entries import (
    MAX_ENTRY_SEQ,
    RUN_ENTRY_PREFIX,
    FinishReason,
    InputPart,
    MessagePayload,
    Refs,
    RollbackPayload,
    SummaryPayload,
    ToolCallPayload,
    ToolResultPayload,
)
from app.core.memory import MAX_MEMORY_BYTES, NAMESPACE_PATTERN
from app.core.output_schema import ResponseFormat
from app.core.policy import ContextPolicyPatch
from app.core.projection import ProjectionMeta
from app.core.reasoning import Reasoning
from app.core.run_policy import RunPolicy
from app.core.schedules import TITLE_PLACEHOLDERS
from app.services import approvals as approvals_service
from app.services.webhooks import WebhookEventType

# The documented maximum is the one enforced.
Seq = Annotated[int, Field(ge=0, le=MAX_ENTRY_SEQ)]
MetadataKey = Annotated[
    str, StringConstraints(min_length=1, max_length=metadata_rules.MAX_KEY_LENGTH)
]
MetadataValue = Annotated[str, StringConstraints(max_length=metadata_rules.MAX_VALUE_LENGTH)]
Metadata = Annotated[
    dict[MetadataKey, MetadataValue],
    Field(
        max_length=metadata_rules.MAX_KEYS,
        description=f"Up to {metadata_rules.MAX_KEYS} string key/value pairs, filterable in lists.",
    ),
]
MetadataPatch = Annotated[
    dict[MetadataKey, MetadataValue | None],
    Field(description="Merge patch: a null value removes the key."),
]
Title = Annotated[str, StringConstraints(max_length=512)]
MemoryNamespace = Annotated[
    str,
    StringConstraints(pattern=NAMESPACE_PATTERN),
    Field(description="Letters, digits and _ . : - (not starting with a dot), 1 to 128."),
]


class Strict(BaseModel):
    # strict: a JSON boolean is not an integer (nor 1 a boolean), as the OpenAPI document says.
    model_config = ConfigDict(extra="forbid", strict=True)


class ToolDefinition(Strict):
    name: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
    description: Annotated[str, StringConstraints(max_length=4096)] = ""
    parameters: dict[str, Any] = Field(
        default_factory=lambda: {"type": "object", "properties": {}},
        description="JSON Schema of the arguments.",
    )
    kind: Literal["builtin", "webhook", "client"] = "client"
    url: Annotated[str, StringConstraints(pattern=r"^https?://", max_length=2048)] | None = Field(
        default=None, description="Where a webhook tool is POSTed."
    )
    timeout_seconds: Annotated[float, Field(gt=0, le=3600)] = 30.0


ModelName = Annotated[
    str,
    StringConstraints(pattern=r"^(openai|anthropic|compat|local):\S+$", max_length=256),
    Field(description="provider:model, e.g. openai:gpt-4o-mini."),
]


McpServerName = Annotated[str, StringConstraints(min_length=1, max_length=32)]


class SessionConfig(Strict):
    model: ModelName | None = None
    fallback_model: ModelName | None = Field(
        default=None, description="Answers when the model fails before its first token."
    )
    summarization_model: ModelName | None = Field(
        default=None, description="Writes compaction summaries. Default: the session's model."
    )
    system_prompt: Annotated[str, StringConstraints(max_length=200_000)] | None = None
    max_output_tokens: Annotated[int, Field(ge=1, le=1_000_000)] | None = Field(
        default=None,
        description="The longest answer of the session's asks, unless an ask says otherwise. "
        "Default: the model's (local:* models: 256).",
    )
    temperature: Annotated[float, Field(ge=0, le=2)] | None = Field(
        default=None,
        description="The sampling temperature of the session's asks, unless an ask says "
        "otherwise. Default: the provider's (local:* models: 0, greedy).",
    )
    context_policy: ContextPolicyPatch | None = Field(
        default=None, description="How the context is projected from the journal."
    )
    tools: Annotated[list[ToolDefinition], Field(max_length=128)] | None = None
    run_policy: RunPolicy | None = Field(
        default=None, description="Limits of the session's runs (tool loops, turns, tokens)."
    )
    memory_namespace: MemoryNamespace | None = Field(
        default=None,
        description="Persistent memory to use: its first lines join the system prompt of every "
        "projection, and read_memory / write_memory / update_memory are offered as tools.",
    )
    reasoning: Reasoning | None = Field(
        default=None,
        description="Let the model think before it answers (asks may override it). Default: "
        "off. 422 reasoning_not_supported for a model that cannot reason.",
    )
    mcp_servers: Annotated[list[McpServerName], Field(max_length=16)] | None = Field(
        default=None,
        description="Registered MCP servers (/v1/mcp_servers) whose tools the session's runs "
        "offer, as <server>__<tool>.",
    )


# Up to 100 years: a TTL is a retention period, and make_interval must not overflow.
TtlSeconds = Annotated[int, Field(ge=1, le=3_153_600_000)]


def _text_only(value: Any) -> Any:
    if not isinstance(value, str):
        raise ValueError("a date-time is a string with a time zone, e.g. 2030-01-01T00:00:00Z")
    return value


# JSON has no dates: an RFC 3339 string with its offset (lax parsing of strings only, so that a
# number is not taken for a Unix time).
Timestamp = Annotated[AwareDatetime, Field(strict=False), BeforeValidator(_text_only)]


AgentReference = Annotated[
    str,
    StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}(@[1-9][0-9]{0,8})?$"),
]


class SessionCreate(Strict):
    title: Title | None = None
    metadata: Metadata = Field(default_factory=dict)
    agent: AgentReference | None = Field(
        default=None,
        description="Create the session from this agent: `name` (its latest version) or "
        "`name@version`. The session is pinned to that version; `config` holds the session's "
        "own fields, over the version's.",
    )
    config: SessionConfig = Field(default_factory=SessionConfig)
    ttl_seconds: TtlSeconds | None = Field(
        default=None,
        description="The session expires this long after creation. Default: the tenant's "
        "session TTL, if it has one (else never).",
    )
    expires_at: Timestamp | None = Field(
        default=None, description="When the session expires (instead of `ttl_seconds`)."
    )

    @model_validator(mode="after")
    def _one_expiry(self) -> SessionCreate:
        _check_one_expiry(self.ttl_seconds, self.expires_at)
        return self


class SessionPatch(Strict):
    title: Title | None = None
    metadata: MetadataPatch | None = None
    config: SessionConfig | None = Field(
        default=None, description="Merged field by field; a null field is reset to its default."
    )
    ttl_seconds: TtlSeconds | None = Field(
        default=None, description="The session now expires this long from now."
    )
    expires_at: Timestamp | None = Field(
        default=None,
        description="When the session expires; null: never. A time in the past expires it now.",
    )

    @model_validator(mode="after")
    def _one_expiry(self) -> SessionPatch:
        _check_one_expiry(self.ttl_seconds, self.expires_at)
        return self


def _check_one_expiry(ttl_seconds: int | None, expires_at: datetime | None) -> None:
    if ttl_seconds is not None and expires_at is not None:
        raise ValueError("give ttl_seconds or expires_at, not both")


class ForkRequest(Strict):
    at_seq: Seq | None = Field(
        default=None, description="Share entries 1..at_seq with the parent; default: its rev."
    )
    title: Title | None = Field(default=None, description="Default: the parent's title.")
    metadata: Metadata | None = Field(default=None, description="Default: the parent's metadata.")


class Usage(BaseModel):
    input_tokens: int = Field(description="Prompt tokens, cache reads and writes included.")
    output_tokens: int
    cached_tokens: int = Field(description="Prompt tokens read from the provider's cache.")
    cache_write_tokens: int = Field(
        description="Prompt tokens written to the provider's cache (Anthropic)."
    )
    reasoning_tokens: int = Field(
        default=0,
        description="Of the output, tokens the model reasoned with, where the provider says "
        "(OpenAI's reasoning models); priced as output.",
    )
    cost_usd: float


class AgentPinned(BaseModel):
    id: str
    name: str
    version: int = Field(description="The version the session is pinned to.")


class Session(BaseModel):
    id: str
    title: str | None
    metadata: dict[str, str]
    config: dict[str, Any] = Field(
        description="The config its runs use: with an agent, the agent version's with the "
        "session's own fields (`own_config`) over it."
    )
    agent: AgentPinned | None = Field(
        default=None, description="The agent version the session was created from (or moved to)."
    )
    own_config: dict[str, Any] | None = Field(
        default=None, description="With an agent: the session's own config fields."
    )
    status: str
    rev: int = Field(description="The last seq of the session's thread.")
    usage: Usage
    parent_id: str | None = Field(description="The session this one was forked from.")
    fork_seq: int | None = Field(description="The last seq shared with the parent.")
    expires_at: datetime | None = Field(
        description="Past it the session is gone (404) and then purged; null: never."
    )
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, session: sessions.Session) -> Session:
        return cls(
            id=session.id,
            title=session.title,
            metadata=session.metadata,
            config=session.config.as_json(),
            agent=AgentPinned(
                id=session.agent.id, name=session.agent.name, version=session.agent.version
            )
            if session.agent is not None
            else None,
            own_config=session.given_config.as_json() if session.agent is not None else None,
            status=session.status.value,
            rev=session.rev,
            usage=Usage(
                input_tokens=session.input_tokens,
                output_tokens=session.output_tokens,
                cached_tokens=session.cached_tokens,
                cache_write_tokens=session.cache_write_tokens,
                reasoning_tokens=session.reasoning_tokens,
                cost_usd=float(session.cost_usd),
            ),
            parent_id=session.parent_id,
            fork_seq=session.fork_seq,
            expires_at=session.expires_at,
            created_at=session.created_at,
            updated_at=session.updated_at,
        )


class SessionList(BaseModel):
    data: list[Session]
    has_more: bool
    next_cursor: str | None = Field(description="Pass as `cursor` for the next (older) page.")


def _not_reserved(entry_id: str) -> str:
    if entry_id.startswith(RUN_ENTRY_PREFIX):
        raise ValueError(f"ids starting with {RUN_ENTRY_PREFIX!r} are the service's own")
    return entry_id


EntryId = Annotated[
    str,
    StringConstraints(min_length=1, max_length=128, pattern=r"^[\x21-\x7e]+$"),
    AfterValidator(_not_reserved),
    Field(
        description="Client-chosen id; re-sending it makes the append an idempotent replay. "
        "Ids starting with `run:` are reserved for the entries runs write."
    ),
]


class _EntryIn(Strict):
    id: EntryId | None = None
    refs: Refs = Field(
        default_factory=Refs,
        description="Links to other records; tool_call and tool_result entries need tool_call_id.",
    )

    def refs_json(self) -> dict[str, Any]:
        return self.refs.model_dump(mode="json", exclude_none=True)


class MessageEntryIn(_EntryIn):
    kind: Literal["message"]
    payload: MessagePayload


class ToolCallEntryIn(_EntryIn):
    kind: Literal["tool_call"]
    payload: ToolCallPayload


class ToolResultEntryIn(_EntryIn):
    kind: Literal["tool_result"]
    payload: ToolResultPayload


class SummaryEntryIn(_EntryIn):
    kind: Literal["summary"]
    payload: SummaryPayload


class RollbackEntryIn(_EntryIn):
    kind: Literal["rollback"]
    payload: RollbackPayload


# What a client may append (imports, notes, edits by rollback). Run records (run_start,
# run_end, usage, error, policy_violation) are the service's own: accepting them from outside
# would let a client forge run history.
EntryIn = Annotated[
    MessageEntryIn | ToolCallEntryIn | ToolResultEntryIn | SummaryEntryIn | RollbackEntryIn,
    Field(discriminator="kind"),
]


class AppendRequest(Strict):
    expected_rev: Seq | None = Field(
        default=None, description="Append only if the session is still at this rev (else 409)."
    )
    entries: Annotated[list[EntryIn], Field(min_length=1)]


class Entry(BaseModel):
    id: str
    seq: int
    kind: str
    payload: dict[str, Any]
    refs: dict[str, Any]
    token_count: int
    created_at: datetime

    @classmethod
    def from_row(cls, row: RowMapping) -> Entry:
        return cls(
            id=row["id"],
            seq=row["seq"],
            kind=row["kind"],
            payload=row["payload"],
            refs=row["refs"],
            token_count=row["token_count"],
            created_at=row["created_at"],
        )


class AppendResponse(BaseModel):
    entries: list[Entry]
    rev: int
    replayed: bool = Field(description="True: the ids were already there; nothing was written.")


class EntryPage(BaseModel):
    data: list[Entry]
    has_more: bool
    rev: int


class Health(BaseModel):
    status: Literal["ok", "ready"]
    database: str | None = None
    revision: str | None = None
    process: int | None = Field(
        default=None, description="The id of the process that answered (serve runs several)."
    )


PendingEntryIn = Annotated[
    MessageEntryIn | ToolCallEntryIn | ToolResultEntryIn, Field(discriminator="kind")
]


class ProjectionRequest(Strict):
    pending: Annotated[list[PendingEntryIn], Field(max_length=1000)] = Field(
        default_factory=list, description="Entries not yet committed, e.g. the next user message."
    )
    policy: ContextPolicyPatch | None = Field(
        default=None, description="Per-request policy fields, over the session's."
    )
    model: ModelName | None = None
    tools: Annotated[list[ToolDefinition], Field(max_length=128)] | None = Field(
        default=None, description="An ask's own tools, over the session's (same name wins)."
    )
    format: Literal["neutral", "openai", "openai_responses", "anthropic"] = Field(
        default="neutral",
        description="The wire shape: neutral, openai (Chat Completions), openai_responses "
        "(the Responses API's input items, as reasoning models get them), anthropic.",
    )


class ProjectionResponse(BaseModel):
    model: str
    format: Literal["neutral", "openai", "openai_responses", "anthropic"]
    context_window: int
    policy: dict[str, Any] = Field(description="The resolved policy (every field).")
    meta: ProjectionMeta
    request: dict[str, Any] = Field(
        description="What would be sent: messages (and tools; `system` for Anthropic)."
    )


class Compaction(BaseModel):
    seq: int = Field(description="The summary entry.")
    from_seq: int
    to_seq: int = Field(description="History up to here is replaced by the summary.")
    model: str | None
    focus: str | None
    tokens: int = Field(description="The summary's size.")
    created_at: datetime


class ContextUsage(BaseModel):
    model: str
    context_window: int
    budget: int = Field(description="Tokens the prompt may use: window - reserve_output_tokens.")
    reserve_output_tokens: int
    tokens: int = Field(description="Tokens of the prompt an ask would send now.")
    percent_of_window: float
    threshold: float = Field(description="compress_threshold: share of the budget.")
    threshold_tokens: int
    messages: int
    entries_included: int
    entries_total: int
    summaries: int = Field(description="Summary checkpoints (compactions) in the thread.")
    summary_used: bool
    truncated: bool
    needs_summary: bool
    breakdown: dict[str, int] = Field(
        description="Tokens by segment: system (the prompt), memory, summary, tools, history, "
        "and overhead (the reply's priming, and the estimate margin of a model counted only "
        "approximately); they add up to `tokens`."
    )
    shares: dict[str, float] = Field(
        description="Percent of the context window each segment of the breakdown uses."
    )
    compactions: list[Compaction] = Field(
        description="The newest summary checkpoints (up to 20), newest first."
    )
    compactable: bool = Field(
        description="Whether POST /compact (with the policy's keep_last_turns) would find "
        "anything to summarize now; false: it answers 409 nothing_to_compact."
    )
    not_compactable_reason: str | None = Field(
        description="Why there is nothing to compact, in words for a person; null when compactable."
    )


class NamedToolChoice(Strict):
    type: Literal["function"]
    name: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,64}$")] = Field(
        description="One of the run's tools (the session's, the ask's, built-ins)."
    )


class AskInput(Strict):
    """What every ask says: its input, and the options a schedule's ask takes too."""

    input: str | Annotated[list[InputPart], Field(min_length=1)] = Field(
        description="The user's message: text, or content parts."
    )
    model: ModelName | None = Field(default=None, description="Default: the session's model.")
    context_policy: ContextPolicyPatch | None = None
    max_output_tokens: Annotated[int, Field(ge=1, le=1_000_000)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None


class AskRequest(AskInput):
    metadata: Metadata = Field(default_factory=dict)
    stream: bool = Field(default=True, description="true: answer with the run's SSE stream.")
    multitask_strategy: Literal["reject", "enqueue", "interrupt", "rollback", "steer"] = Field(
        default="reject",
        description="When a run is in progress: reject (409), enqueue (run after it), "
        "interrupt (cancel it, then run), rollback (cancel it and take its entries out of "
        "the context, then run), steer (tell the running run: the message is committed now "
        "and journaled at the run's next model turn, after its current tool results, which "
        "sees it; the answer is the running run (its stream, or 202 with it) with the "
        "Threadline-Steer-Id header, and its `run.steered` event says where the message "
        "landed; if the run ends first, the message starts the next run; if it is "
        "cancelled, the message is kept and starts nothing). With no run in progress, an "
        "ask like any other.",
    )
    run_policy: RunPolicy | None = Field(
        default=None, description="Overrides of the session's run_policy for this ask."
    )
    mcp_servers: Annotated[list[McpServerName], Field(max_length=16)] | None = Field(
        default=None,
        description="Registered MCP servers whose tools this ask offers too (as "
        "<server>__<tool>), besides the session's.",
    )
    tools: Annotated[list[ToolDefinition], Field(max_length=128)] | None = Field(
        default=None, description="Tools for this ask only, over the session's (same name wins)."
    )
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice = Field(
        default="auto",
        description="auto: the model decides; none: no tool call; required: at least one call; "
        "{type: function, name}: a call of that tool (422 invalid_tool_choice if the run has "
        "no such tool, or the model cannot be made to call tools). required and a named tool "
        "hold for the run's first model turn; later turns of its tool loop are auto.",
    )
    parallel_tool_calls: bool = Field(
        default=True,
        description="false: at most one tool call per model turn (on every turn of the run).",
    )
    on_disconnect: Literal["continue", "cancel"] = Field(
        default="continue", description="cancel: a stream client going away cancels the run."
    )
    reasoning: Reasoning | None = Field(
        default=None,
        description="Let the model think before it answers, for this ask (over the session's "
        'config.reasoning; {"effort": "none"} turns it off). 422 reasoning_not_supported for a '
        "model that cannot reason.",
    )
    response_format: ResponseFormat | None = Field(
        default=None,
        description="Structured output: the answer is JSON following this JSON Schema, sent "
        "to each provider its way (OpenAI response_format, Anthropic output_config.format, a "
        "llama.cpp grammar for local models). The schema must follow OpenAI's strict-mode rules "
        "(422 invalid_output_schema with details.location, a JSON pointer, otherwise). The "
        "answer entry is marked `structured` {name, schema_sha256}; an answer that does not "
        "follow the schema fails the run with structured_output_invalid (its text kept).",
    )


class RunUsage(BaseModel):
    input_tokens: int = Field(description="Prompt tokens, cache reads and writes included.")
    output_tokens: int
    cached_tokens: int = Field(description="Prompt tokens read from the provider's cache.")
    cache_write_tokens: int = Field(
        description="Prompt tokens written to the provider's cache (Anthropic)."
    )
    reasoning_tokens: int = Field(
        default=0,
        description="Of the output, tokens the model reasoned with, where the provider says "
        "(OpenAI's reasoning models); priced as output.",
    )
    cost_usd: float | None
    estimated: bool = Field(
        default=False,
        description="The provider reported no usage: the counts are the service's tokenizer "
        "estimate.",
    )


class CompactRequest(Strict):
    focus: Annotated[str, StringConstraints(max_length=2000)] | None = Field(
        default=None,
        description='What the summary should concentrate on, e.g. "API changes".',
    )
    keep_last_turns: Annotated[int, Field(ge=0, le=10_000)] | None = Field(
        default=None,
        description="Turns kept raw after the summary. Default: the context policy's "
        "keep_last_turns; 0 summarizes everything.",
    )
    model: ModelName | None = Field(
        default=None,
        description="The summarization model. Default: the session's summarization_model, "
        "else its model.",
    )
    stream: bool = Field(
        default=False, description="true: answer with the compaction run's SSE stream."
    )


class Run(BaseModel):
    id: str
    session_id: str
    kind: Literal["ask", "compaction"] = Field(
        description="ask: answers a user entry; compaction: appends a summary checkpoint."
    )
    status: Literal[
        "queued",
        "running",
        "requires_action",
        "awaiting_approval",
        "completed",
        "failed",
        "cancelled",
    ]
    model: str
    user_entry_seq: int | None
    end_entry_seq: int | None
    result: str | None = Field(
        description="The final (or partial) assistant text; a compaction's summary."
    )
    finish_reason: FinishReason | None = Field(
        default=None,
        description="Why the model stopped its final answer: stop (complete), length (cut off "
        "by max_output_tokens: the answer is truncated), tool_calls, content_filter, other. "
        "Null until the run completes, and for compactions and failed or cancelled runs.",
    )
    error: dict[str, Any] | None
    usage: RunUsage
    attempts: int
    cancel_mode: str | None
    created_at: datetime
    started_at: datetime | None
    ended_at: datetime | None

    @classmethod
    def of(cls, run: runs.Run) -> Run:
        return cls(
            id=run.id,
            session_id=run.session_id,
            kind=run.kind.value,
            status=run.status.value,
            model=run.model,
            user_entry_seq=run.user_entry_seq,
            end_entry_seq=run.end_entry_seq,
            result=run.result,
            finish_reason=run.finish_reason,
            error=run.error,
            usage=RunUsage(
                input_tokens=run.input_tokens,
                output_tokens=run.output_tokens,
                cached_tokens=run.cached_tokens,
                cache_write_tokens=run.cache_write_tokens,
                reasoning_tokens=run.reasoning_tokens,
                cost_usd=float(run.cost_usd) if run.cost_usd is not None else None,
                estimated=run.usage_estimated,
            ),
            attempts=run.attempts,
            cancel_mode=run.cancel_mode,
            created_at=run.created_at,
            started_at=run.started_at,
            ended_at=run.ended_at,
        )


class ToolOutputIn(Strict):
    tool_call_id: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,128}$")]
    output: Any = Field(description="The tool's result: text or any JSON.")
    is_error: bool = False


class ToolOutputsRequest(Strict):
    tool_outputs: Annotated[list[ToolOutputIn], Field(min_length=1, max_length=128)]


class ApprovalAnswerIn(Strict):
    tool_call_id: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,128}$")] = Field(
        description="A call of the run's `tool.approval_requested` events."
    )
    decision: Literal["approve", "reject"]
    arguments: dict[str, Any] | None = Field(
        default=None,
        description="With `approve`: run the call with these arguments instead of the "
        "model's (checked against the tool's JSON schema: 422 `invalid_arguments`).",
    )
    reason: Annotated[str, StringConstraints(max_length=4000)] | None = Field(
        default=None, description="With `reject`: why, as the model reads it in the result."
    )

    @model_validator(mode="after")
    def _fits_decision(self) -> ApprovalAnswerIn:
        if self.decision == "reject" and self.arguments is not None:
            raise ValueError("arguments go with approve only")
        if self.decision == "approve" and self.reason is not None:
            raise ValueError("a reason goes with reject only")
        return self


class ApprovalsRequest(Strict):
    approvals: Annotated[list[ApprovalAnswerIn], Field(min_length=1, max_length=128)] = Field(
        description="Rulings on some or all of the calls the run waits on; the run resumes "
        "once none waits."
    )


class ToolApprovalOut(BaseModel):
    tool_call_id: str
    name: str
    arguments: dict[str, Any] = Field(description="The arguments the model gave.")
    status: Literal["pending", "approved", "rejected", "expired"]
    edited_arguments: dict[str, Any] | None = Field(
        description="The arguments it was approved with, when they were edited."
    )
    reason: str | None = Field(description="A rejection's reason.")
    executed: bool = Field(description="The approved call was started (it runs at most once).")
    requested_at: datetime
    decided_at: datetime | None


class RunApprovals(BaseModel):
    run: Run
    approvals: list[ToolApprovalOut] = Field(description="The run's approvals, oldest first.")

    @classmethod
    def of(cls, found: approvals_service.RunApprovals) -> RunApprovals:
        return cls(
            run=Run.of(found.run),
            approvals=[
                ToolApprovalOut(
                    tool_call_id=a.tool_call_id,
                    name=a.name,
                    arguments=a.arguments,
                    status=a.decision or "pending",
                    edited_arguments=a.edited_arguments,
                    reason=a.reason,
                    executed=a.executed_at is not None,
                    requested_at=a.requested_at,
                    decided_at=a.decided_at,
                )
                for a in found.approvals
            ],
        )


class MemoryPut(Strict):
    content: str = Field(
        description=f"The whole memory (Markdown); at most {MAX_MEMORY_BYTES} bytes of UTF-8, "
        "else 422 memory_too_large."
    )


class MemoryPatch(Strict):
    old_string: Annotated[str, StringConstraints(min_length=1)] = Field(
        description="Text to find: it must occur exactly once unless replace_all "
        "(else 422 no_match / ambiguous_match)."
    )
    new_string: str = Field(description="Its replacement (empty: delete it).")
    replace_all: bool = Field(default=False, description="Replace every occurrence.")


class Memory(BaseModel):
    namespace: str
    content: str
    version: int = Field(description="1 at creation, +1 per write.")
    etag: str = Field(description="The ETag header's value: send it as If-Match to write.")
    bytes: int = Field(description="Size of the content in UTF-8.")
    lines: int
    created_at: datetime
    updated_at: datetime


class MemorySummary(BaseModel):
    namespace: str
    version: int
    etag: str
    bytes: int
    lines: int
    created_at: datetime
    updated_at: datetime


class MemoryList(BaseModel):
    data: list[MemorySummary]
    has_more: bool
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page.")


# A stream token's lifetime when the request names none (capped by the server's maximum).
DEFAULT_STREAM_TOKEN_SECONDS = 300
Uuid = Annotated[
    str,
    StringConstraints(
        pattern=r"^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}$"
    ),
]


class StreamTokenRequest(Strict):
    session_id: Uuid | None = Field(
        default=None,
        description="The session whose streams the token opens: GET /v1/sessions/{id}/stream "
        "and GET /v1/runs/{id}/events of its runs.",
    )
    run_id: Uuid | None = Field(
        default=None, description="Or the one run whose events it opens (GET /v1/runs/{id}/events)."
    )
    expires_in: int | None = Field(
        default=None,
        ge=1,
        description=f"Seconds the token is valid; default {DEFAULT_STREAM_TOKEN_SECONDS}, at most "
        "THREADLINE_STREAM_TOKEN_MAX_SECONDS (422 above). A stream is checked when it opens: one "
        "that is open when the token expires goes on.",
    )

    @model_validator(mode="after")
    def _one_scope(self) -> StreamTokenRequest:
        if (self.session_id is None) == (self.run_id is None):
            raise ValueError("give exactly one of session_id and run_id")
        return self


class StreamToken(BaseModel):
    token: str = Field(
        description="Pass as `?token=` to the stream endpoints it opens (they need no "
        "Authorization then). Never an API key: it opens only these streams, until it expires."
    )
    expires_at: datetime
    session_id: str | None = Field(description="The session it is scoped to, if so.")
    run_id: str | None = Field(description="The run it is scoped to, if so.")
    stream_url: str = Field(
        description="The path (and query) of the stream it opens: the session's stream, or the "
        "run's events. Resume with `&starting_after=<last id>` in a new EventSource."
    )


HeaderMap = Annotated[
    dict[str, Annotated[str, StringConstraints(max_length=8192)]], Field(max_length=32)
]
McpToolNames = Annotated[
    list[Annotated[str, StringConstraints(min_length=1, max_length=128)]], Field(max_length=256)
]


class McpServerCreate(Strict):
    name: McpServerName = Field(
        description="Letters, digits, - and single _; its tools are offered as <name>__<tool>."
    )
    url: Annotated[str, StringConstraints(min_length=1, max_length=2048)] = Field(
        description="The server's endpoint; it must be reachable under outbound_allowed."
    )
    transport: Literal["streamable_http", "sse"] = "streamable_http"
    headers: HeaderMap | None = Field(
        default=None, description="Sent with every request; stored encrypted, never shown again."
    )
    bearer_token: Annotated[str, StringConstraints(min_length=1, max_length=8192)] | None = Field(
        default=None, description="Sent as Authorization: Bearer; stored encrypted."
    )
    allowed_tools: McpToolNames | None = Field(
        default=None, description="Only these of the server's tools. Default: all of them."
    )


class McpServerUpdate(Strict):
    url: Annotated[str, StringConstraints(min_length=1, max_length=2048)] | None = None
    transport: Literal["streamable_http", "sse"] | None = None
    headers: HeaderMap | None = Field(default=None, description="Replaces the stored headers.")
    bearer_token: Annotated[str, StringConstraints(max_length=8192)] | None = Field(
        default=None, description="Replaces the stored token; an empty string removes it."
    )
    allowed_tools: McpToolNames | None = Field(
        default=None, description="Replaces the allow-list; an empty list offers no tool."
    )


class McpServerCredentials(BaseModel):
    header_names: list[str] = Field(description="The names of the stored headers (not values).")
    bearer_token_set: bool


class McpServerOut(BaseModel):
    id: str
    name: str
    url: str
    transport: str
    allowed_tools: list[str] | None
    credentials: McpServerCredentials
    created_at: datetime
    updated_at: datetime


class McpServerList(BaseModel):
    data: list[McpServerOut]


class WebhookCreate(Strict):
    url: Annotated[str, StringConstraints(min_length=1, max_length=2048)] = Field(
        description="An http:// or https:// URL; private addresses are allowed."
    )
    session_id: Annotated[UUID, Field(strict=False)] | None = Field(
        default=None,
        description="Only this session's runs (deleted with it). Default: every session of "
        "the tenant.",
    )
    event_types: list[WebhookEventType] | None = Field(
        default=None, min_length=1, description="Only these events. Default: all of them."
    )


class Webhook(BaseModel):
    id: str
    url: str
    session_id: str | None
    event_types: list[str] | None
    created_at: datetime

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> Webhook:
        return cls(
            id=str(row["id"]),
            url=row["url"],
            session_id=str(row["session_id"]) if row["session_id"] else None,
            event_types=row["event_types"],
            created_at=row["created_at"],
        )


class WebhookCreated(Webhook):
    secret: str = Field(
        description="whsec_<base64>: verifies the signatures (Standard Webhooks). Shown only "
        "in this response."
    )

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> WebhookCreated:
        """`row`: the new endpoint's, with its secret in clear (only registration has it)."""
        return cls(**Webhook.from_row(row).model_dump(), secret=row["secret"])


class WebhookList(BaseModel):
    data: list[Webhook]


class WebhookDelivery(BaseModel):
    id: str = Field(description="Sent as the `webhook-id` header: the same on every attempt.")
    run_id: str
    event_type: str
    status: Literal["pending", "delivered", "failed"]
    attempts: int
    last_status_code: int | None = Field(description="The receiver's last answer, if any.")
    last_error: str | None
    created_at: datetime
    last_attempt_at: datetime | None
    delivered_at: datetime | None
    payload: dict[str, Any] = Field(description="The body sent.")

    @classmethod
    def from_row(cls, row: RowMapping) -> WebhookDelivery:
        return cls(
            id=str(row["id"]),
            run_id=str(row["run_id"]),
            event_type=row["event_type"],
            status=row["status"],
            attempts=row["attempts"],
            last_status_code=row["last_status_code"],
            last_error=row["last_error"],
            created_at=row["created_at"],
            last_attempt_at=row["last_attempt_at"],
            delivered_at=row["delivered_at"],
            payload=json.loads(row["body"]),
        )


class WebhookDeliveryList(BaseModel):
    data: list[WebhookDelivery] = Field(description="Newest first.")
    has_more: bool
    next_cursor: str | None = Field(description="Pass as `cursor` for the next (older) page.")


# --- Agents ------------------------------------------------------------------------------

AgentName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]
Description = Annotated[str, StringConstraints(max_length=2000)]


class AgentCreate(Strict):
    name: AgentName = Field(description="Unique among the tenant's agents; never changes.")
    description: Description | None = None
    config: SessionConfig = Field(
        default_factory=SessionConfig,
        description="What its sessions run with: instructions (`system_prompt`), model, "
        "reasoning, sampling, tools, context and run policies, memory namespace.",
    )
    metadata: Metadata = Field(default_factory=dict)


class AgentUpdate(Strict):
    description: Description | None = None
    config: SessionConfig | None = Field(
        default=None, description="The new version's config, whole (it replaces the latest's)."
    )
    metadata: Metadata | None = None


class AgentVersion(BaseModel):
    name: str
    version: int
    description: str | None
    config: dict[str, Any]
    metadata: dict[str, str]
    created_at: datetime


class Agent(BaseModel):
    id: str
    name: str
    version: int = Field(description="Its latest version.")
    description: str | None
    config: dict[str, Any] = Field(description="Its latest version's config.")
    metadata: dict[str, str]
    created_at: datetime
    updated_at: datetime


class AgentList(BaseModel):
    data: list[Agent]


class AgentVersionList(BaseModel):
    data: list[AgentVersion]


class SessionAgentMove(Strict):
    version: Annotated[int, Field(ge=1)] | None = Field(
        default=None, description="The version to move to; default: the agent's latest."
    )


# Schedules (/v1/schedules): cron asks.
CronExpression = Annotated[str, StringConstraints(min_length=1, max_length=200)]
TimeZoneName = Annotated[str, StringConstraints(min_length=1, max_length=64)]
TitleTemplate = Annotated[str, StringConstraints(max_length=512)]
ScheduleName = Annotated[str, StringConstraints(min_length=1, max_length=200)]


class ScheduleAsk(AskInput):
    """What a schedule asks at each due time: the ask body's input and per-ask options."""

    metadata: Metadata = Field(
        default_factory=dict,
        description="The run's metadata (`schedule_id` is added: the schedule's id).",
    )
    run_policy: RunPolicy | None = None
    reasoning: Reasoning | None = None


SCHEDULE_TITLE_DOC = "Title of each new session; placeholders: " + ", ".join(
    f"{{{name}}} ({meaning})" for name, meaning in TITLE_PLACEHOLDERS.items()
)


class ScheduleCreate(Strict):
    name: ScheduleName
    cron: CronExpression = Field(
        description="Five fields (minute hour day month weekday) or an alias (@daily, @hourly), "
        "read in the time zone's wall clock. A time the clocks skip (DST) is due when they "
        "jump; one they repeat, at its first occurrence. 422 invalid_cron with the reason."
    )
    timezone: TimeZoneName = Field(
        default="UTC", description="An IANA time zone (Europe/Berlin); 422 invalid_timezone."
    )
    ask: ScheduleAsk
    session_id: Annotated[UUID, Field(strict=False)] | None = Field(
        default=None, description="Ask in this session each time (or give `agent`)."
    )
    agent: AgentName | None = Field(
        default=None, description="Ask in a new session from this agent each time."
    )
    agent_version: Annotated[int, Field(ge=1)] | None = Field(
        default=None, description="The agent version its sessions pin; default: the latest."
    )
    title_template: TitleTemplate | None = Field(default=None, description=SCHEDULE_TITLE_DOC)
    misfire: Literal["run_once", "skip"] = Field(
        default="run_once",
        description="A due time missed (no worker ran, past THREADLINE_SCHEDULE_MISFIRE_GRACE_"
        "SECONDS): run_once fires once for all the times missed, skip records one skipped "
        "firing. Never once per missed time.",
    )
    busy: Literal["queue", "skip"] = Field(
        default="queue",
        description="The target session has a run in progress: queue (the ask's enqueue "
        "strategy: it runs after it) or skip (a skipped firing, reason session_busy).",
    )
    enabled: bool = True

    @model_validator(mode="after")
    def _one_target(self) -> ScheduleCreate:
        if (self.session_id is None) == (self.agent is None):
            raise ValueError("give either session_id or agent")
        if self.session_id is not None and (
            self.agent_version is not None or self.title_template is not None
        ):
            raise ValueError("agent_version and title_template go with agent")
        return self


class ScheduleUpdate(Strict):
    name: ScheduleName | None = None
    cron: CronExpression | None = None
    timezone: TimeZoneName | None = None
    ask: ScheduleAsk | None = None
    agent_version: Annotated[int, Field(ge=1)] | None = None
    title_template: TitleTemplate | None = None
    misfire: Literal["run_once", "skip"] | None = None
    busy: Literal["queue", "skip"] | None = None
    enabled: bool | None = Field(
        default=None,
        description="false: no firing until enabled again; enabling fires from the next due "
        "time on (times missed while disabled are not fired).",
    )


class Schedule(BaseModel):
    id: str
    name: str
    cron: str
    timezone: str
    ask: ScheduleAsk
    session_id: str | None
    agent: str | None
    agent_version: int | None
    title_template: str | None
    misfire: str
    busy: str
    enabled: bool
    next_due_at: datetime = Field(description="When it fires next (while enabled).")
    created_at: datetime
    updated_at: datetime


class ScheduleList(BaseModel):
    data: list[Schedule]


class ScheduleRun(BaseModel):
    """One due time of a schedule: the run it started, or why it started none."""

    due_at: datetime
    status: Literal["fired", "skipped", "failed"] = Field(
        description="fired: a run was started (run_id, run_status); skipped: by the busy or "
        "misfire policy; failed: the ask was refused (reason: its error code, e.g. a quota's)."
    )
    reason: str | None
    message: str | None
    session_id: str | None
    run_id: str | None
    run_status: str | None = Field(description="The run's status now.")
    created_at: datetime


class ScheduleRunList(BaseModel):
    data: list[ScheduleRun]
