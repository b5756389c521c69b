"""The session value: its config reads back as it was stored, its thread through its lineage."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from app.core.lineage import Ancestor, Segment
from app.core.sessions import Session, SessionConfig, SessionStatus

FULL: dict[str, Any] = {
    "model": "openai:gpt-4o",
    "fallback_model": "anthropic:claude-haiku-4-5",
    "summarization_model": "openai:gpt-4o-mini",
    "system_prompt": "Be brief.",
    "max_output_tokens": 256,
    "temperature": 0.0,
    "context_policy": {"preset": "short_context", "include_kinds": ["message"]},
    "tools": [{"name": "calculator", "kind": "builtin"}],
    "run_policy": {"max_iterations": 3},
    "memory_namespace": "notes",
    "reasoning": {"effort": "low"},
}


def test_a_config_reads_back_as_it_was_stored() -> None:
    config = SessionConfig.from_json(FULL)
    assert config.model == "openai:gpt-4o" and config.memory_namespace == "notes"
    assert config.run_policy == {"max_iterations": 3}  # a layer, merged when a run resolves it
    assert config.as_json() == FULL
    # Only the fields given come back, and an empty list given stays given.
    assert SessionConfig.from_json({}).as_json() == {}
    assert SessionConfig.from_json({"tools": []}).as_json() == {"tools": []}


def session(**changes: Any) -> Session:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    blank = Session(
        id="s",
        tenant_id="t",
        title=None,
        metadata={},
        config=SessionConfig(),
        status=SessionStatus.IDLE,
        rev=0,
        parent_id=None,
        fork_seq=None,
        lineage=(),
        input_tokens=0,
        output_tokens=0,
        cached_tokens=0,
        cache_write_tokens=0,
        reasoning_tokens=0,
        cost_usd=Decimal(0),
        created_at=now,
        updated_at=now,
        expires_at=None,
    )
    return replace(blank, **changes)


def test_a_session_reads_its_thread_through_its_lineage() -> None:
    fork = session(lineage=(Ancestor("a", 3), Ancestor("p", 5)), rev=5, parent_id="p", fork_seq=5)
    assert fork.thread == [Segment("a", 0, 3), Segment("p", 3, 5)]  # nothing of its own yet
    grown = replace(fork, rev=7)
    assert grown.thread == [Segment("a", 0, 3), Segment("p", 3, 5), Segment("s", 5, None)]
    assert session().thread == []


def test_tokens_used_are_input_and_output() -> None:
    assert session(input_tokens=10, output_tokens=4, cached_tokens=8).tokens_used == 14
