"""The run as a typed value: its status, kind, parameters and results, read from its row."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from enum import StrEnum
from typing import Any, Literal

from app.core import tool_choice as tool_choices
from app.core.entries import RUN_ENTRY_PREFIX, FinishReason
from app.core.tool_choice import ToolChoice
from app.core.usage import UsageReport


class RunStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    REQUIRES_ACTION = "requires_action"  # waiting for the client's tool outputs
    AWAITING_APPROVAL = "awaiting_approval"  # waiting for a person to rule on tool calls
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


ACTIVE = frozenset(
    {
        RunStatus.QUEUED,
        RunStatus.RUNNING,
        RunStatus.REQUIRES_ACTION,
        RunStatus.AWAITING_APPROVAL,
    }
)
# The active statuses in which a run waits for its client's tool outputs or a person's rulings.
WAITING = frozenset({RunStatus.REQUIRES_ACTION, RunStatus.AWAITING_APPROVAL})
# The statuses a run ends with, each with its terminal event (app.eventlog.registry).
ENDED = frozenset({RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED})


class RunKind(StrEnum):
    ASK = "ask"  # answers a user entry
    COMPACTION = "compaction"  # appends a summary checkpoint (POST /compact)


CancelMode = Literal["cancel", "interrupt", "rollback"]
OnDisconnect = Literal["continue", "cancel"]


@dataclass(frozen=True)
class RunParams:
    """What the request asked for, stored with the run (the `params` column)."""

    max_output_tokens: int | None = None
    temperature: float | None = None
    context_policy: dict[str, Any] | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    on_disconnect: OnDisconnect = "continue"
    fallback_model: str | None = None
    run_policy: dict[str, Any] | None = None
    tools: list[dict[str, Any]] = field(default_factory=list)
    mcp_servers: list[str] = field(default_factory=list)  # the ask's own, by name
    # servers the request described itself (the Responses API's `mcp` tools): each
    # {"name", "url" (None: the registered server of that name), "headers" (sealed by the
    # credential vault), "allowed_tools", "require_approval"}
    mcp_inline: list[dict[str, Any]] = field(default_factory=list)
    # which tools the model may or must call (app.core.tool_choice), and whether a turn may
    # call several
    tool_choice: ToolChoice = "auto"
    parallel_tool_calls: bool = True
    # the reasoning the run's model turns use (the ask's, else the session's; None: off)
    reasoning: dict[str, Any] | None = None
    # the JSON Schema format the answer follows (app.core.output_schema; None: free text)
    response_format: dict[str, Any] | None = None
    # a compaction's
    focus: str | None = None
    keep_last_turns: int | None = None
    # what the run carries from the request that created it to its worker: request_id and
    # traceparent (app/telemetry/carried.py)
    telemetry: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunParams:
        return cls(
            max_output_tokens=data.get("max_output_tokens"),
            temperature=data.get("temperature"),
            context_policy=data.get("context_policy"),
            metadata=dict(data.get("metadata") or {}),
            on_disconnect=data.get("on_disconnect") or "continue",
            fallback_model=data.get("fallback_model"),
            run_policy=data.get("run_policy"),
            tools=list(data.get("tools") or []),
            mcp_servers=list(data.get("mcp_servers") or []),
            mcp_inline=list(data.get("mcp_inline") or []),
            tool_choice=tool_choices.parse(data.get("tool_choice") or "auto"),
            parallel_tool_calls=data.get("parallel_tool_calls", True),
            reasoning=data.get("reasoning"),
            response_format=data.get("response_format"),
            focus=data.get("focus"),
            keep_last_turns=data.get("keep_last_turns"),
            telemetry=dict(data.get("telemetry") or {}),
        )

    def mcp_server_names(self, session_servers: Sequence[str] | None) -> list[str]:
        """Every MCP server the run uses, by name: its session's, its ask's, and those its
        request described."""
        return [*(session_servers or []), *self.mcp_servers, *(s["name"] for s in self.mcp_inline)]

    def ask_json(self) -> dict[str, Any]:
        return {
            "max_output_tokens": self.max_output_tokens,
            "temperature": self.temperature,
            "context_policy": self.context_policy,
            "metadata": self.metadata,
            "on_disconnect": self.on_disconnect,
            "fallback_model": self.fallback_model,
            "run_policy": self.run_policy,
            "tools": self.tools,
            "mcp_servers": self.mcp_servers,
            "mcp_inline": self.mcp_inline,
            "tool_choice": tool_choices.as_json(self.tool_choice),
            "parallel_tool_calls": self.parallel_tool_calls,
            "reasoning": self.reasoning,
            "response_format": self.response_format,
            "telemetry": self.telemetry,
        }

    def compaction_json(self) -> dict[str, Any]:
        return {
            "focus": self.focus,
            "keep_last_turns": self.keep_last_turns,
            "telemetry": self.telemetry,
        }


@dataclass(frozen=True)
class Run:
    id: str
    tenant_id: str
    session_id: str
    status: RunStatus
    kind: RunKind
    model: str
    params: RunParams
    attempts: int
    created_at: datetime
    idempotency_key: str | None = None
    user_entry_seq: int | None = None
    end_entry_seq: int | None = None  # the run_end entry: rollbacks reach up to it
    result: str | None = None
    finish_reason: FinishReason | None = None
    error: dict[str, Any] | None = None
    cancel_mode: CancelMode | None = None  # set when a cancel was requested
    job_id: int | None = None
    lease: int | None = None  # the worker lease of the current attempt
    workers_lost: int = 0  # workers that died while running it
    action_expires_at: datetime | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0
    usage_estimated: bool = False
    cost_usd: Decimal | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None

    @classmethod
    def from_row(cls, row: Any) -> Run:  # a RowMapping of the runs table
        return cls(
            id=str(row["id"]),
            tenant_id=str(row["tenant_id"]),
            session_id=str(row["session_id"]),
            status=RunStatus(row["status"]),
            kind=RunKind(row["kind"]),
            model=row["model"],
            params=RunParams.from_json(row["params"] or {}),
            attempts=int(row["attempts"]),
            created_at=row["created_at"],
            idempotency_key=row["idempotency_key"],
            user_entry_seq=row["user_entry_seq"],
            end_entry_seq=row["end_entry_seq"],
            result=row["result"],
            finish_reason=row["finish_reason"],
            error=row["error"],
            cancel_mode=row["cancel_mode"],
            job_id=row["job_id"],
            lease=row["lease"],
            workers_lost=int(row["workers_lost"]),
            action_expires_at=row["action_expires_at"],
            input_tokens=int(row["input_tokens"]),
            output_tokens=int(row["output_tokens"]),
            cached_tokens=int(row["cached_tokens"]),
            cache_write_tokens=int(row["cache_write_tokens"]),
            reasoning_tokens=int(row["reasoning_tokens"]),
            usage_estimated=bool(row["usage_estimated"]),
            cost_usd=row["cost_usd"],
            started_at=row["started_at"],
            ended_at=row["ended_at"],
        )

    @property
    def input_seq(self) -> int:
        """The user entry an ask answers (a compaction answers none)."""
        if self.user_entry_seq is None:
            raise ValueError(f"run {self.id} is a {self.kind.value}: it answers no user entry")
        return self.user_entry_seq

    @property
    def active(self) -> bool:
        return self.status in ACTIVE

    @property
    def answers(self) -> bool:
        """An ask's text is an answer; a compaction's is its summary, committed as such."""
        return self.kind is RunKind.ASK


Ending = Literal["completed", "failed", "cancelled"]


@dataclass(frozen=True)
class Outcome:
    """How a run ends, as its worker (or a cancel) saw it."""

    status: Ending
    text: str = ""  # the assistant text received, whole or partial
    usage: UsageReport | None = None
    error: dict[str, str] | None = None  # {"code", "message"} for failed runs
    model: str | None = None  # the model that answered (a fallback, maybe)
    finish_reason: FinishReason | None = None  # why the model's last turn ended
    # The answer's content parts when the model reasoned (its reasoning blocks among its
    # text); else the text is the content. Only a completed answer keeps them.
    parts: tuple[dict[str, Any], ...] = ()
    # The answer's mark when it was asked for as structured output (StructuredMark's fields).
    structured: dict[str, str] | None = None
    # The oldest history entry's seq in the context the answer was written from (its entry's
    # refs.context_from).
    context_from: int | None = None


def entry_id(run_id: str, part: str) -> str:
    """The id of an entry a run commits: derived from the run, so a retried attempt that
    commits it again writes nothing twice."""
    return f"{RUN_ENTRY_PREFIX}{run_id}:{part}"
