"""The session as a typed value: its config, lineage and usage, as its row stores them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from enum import StrEnum
from typing import Any

from app.core.agents import AgentPin
from app.core.lineage import Lineage, Segment, segments


class SessionStatus(StrEnum):
    IDLE = "idle"
    ACTIVE = "active"  # a run of it is under way


@dataclass(frozen=True, slots=True)
class SessionConfig:
    """The config a session was given (the `config` column), checked on the way in by the
    API's SessionConfig and taken as stored here, with no second validation on every read.

    `context_policy` and `run_policy` stay the partial layers the client gave: they are merged
    under the server's and over a request's when a run resolves its policy; `reasoning` stays
    the setting given, which an ask's replaces (app/core/reasoning.effective). `tools` are the
    tool definitions as JSON, as a run's own are (app/core/runs.RunParams)."""

    model: str | None = None
    fallback_model: str | None = None
    summarization_model: str | None = None
    system_prompt: str | None = None
    max_output_tokens: int | None = None  # an ask's own win
    temperature: float | None = None
    context_policy: Mapping[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    run_policy: Mapping[str, Any] | None = None
    memory_namespace: str | None = None
    reasoning: Mapping[str, Any] | None = None
    mcp_servers: list[str] | None = None  # registered MCP servers, by name

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SessionConfig:
        return cls(
            model=data.get("model"),
            fallback_model=data.get("fallback_model"),
            summarization_model=data.get("summarization_model"),
            system_prompt=data.get("system_prompt"),
            max_output_tokens=data.get("max_output_tokens"),
            temperature=data.get("temperature"),
            context_policy=data.get("context_policy"),
            tools=data.get("tools"),
            run_policy=data.get("run_policy"),
            memory_namespace=data.get("memory_namespace"),
            reasoning=data.get("reasoning"),
            mcp_servers=data.get("mcp_servers"),
        )

    def as_json(self) -> dict[str, Any]:
        """The fields that were given (a stored config holds no nulls), as stored."""
        fields = {
            "model": self.model,
            "fallback_model": self.fallback_model,
            "summarization_model": self.summarization_model,
            "system_prompt": self.system_prompt,
            "max_output_tokens": self.max_output_tokens,
            "temperature": self.temperature,
            "context_policy": self.context_policy,
            "tools": self.tools,
            "run_policy": self.run_policy,
            "memory_namespace": self.memory_namespace,
            "reasoning": self.reasoning,
            "mcp_servers": self.mcp_servers,
        }
        return {name: value for name, value in fields.items() if value is not None}


@dataclass(frozen=True, slots=True)
class Session:
    id: str
    tenant_id: str
    title: str | None
    metadata: dict[str, str]
    config: SessionConfig
    status: SessionStatus
    rev: int  # the last seq of the session's thread (inherited seqs included)
    parent_id: str | None  # the session it was forked from
    fork_seq: int | None  # the last seq shared with the parent
    lineage: Lineage
    input_tokens: int
    output_tokens: int
    cached_tokens: int
    cache_write_tokens: int
    reasoning_tokens: int
    cost_usd: Decimal
    created_at: datetime
    updated_at: datetime
    expires_at: datetime | None  # past it the session is gone for its tenant; None: never
    # Created from an agent: its pinned version. `config` is then the resolved config (the
    # version's, the session's own fields over it) and `own_config` the session's fields.
    agent: AgentPin | None = None
    own_config: SessionConfig | None = None

    @property
    def given_config(self) -> SessionConfig:
        """The config the session itself was given (what a patch changes)."""
        return self.own_config if self.own_config is not None else self.config

    @property
    def thread(self) -> list[Segment]:
        """The storage ranges of the session's thread: its ancestors' prefixes, then its own."""
        return segments(self.id, self.lineage, self.rev)

    @property
    def tokens_used(self) -> int:
        """Input plus output tokens across the session's runs (what max_total_tokens bounds)."""
        return self.input_tokens + self.output_tokens
