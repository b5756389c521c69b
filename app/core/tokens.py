"""Token counting rules: per entry (stored once, at append), per message, per request.

Counting itself is delegated to a `TokenCounter` (tiktoken's encodings live in the shell,
app.llm.tokenizers, because loading them reads files). The chat-format arithmetic follows
OpenAI's published recipe: 3 tokens per message plus its role, 1 more with a name, 3 to prime
the reply. Tool calls, tool definitions and images have no published rule; the constants below
are our documented estimates, applied identically wherever a request is counted.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from app.core.entries import EntryKind
from app.core.messages import Content, Message, ToolCall, ToolSpec, canonical_json, result_text

STORED_ENCODING = "o200k_base"  # entries' token_count is counted in this encoding
PER_MESSAGE = 3
PER_NAME = 1
REPLY_PRIMING = 3
PER_TOOL_CALL = 3
PER_TOOL_DEFINITION = 8
IMAGE_TOKENS = 765  # a 512x512 tile at high detail; low detail costs 85
IMAGE_TOKENS_LOW = 85


class TokenCounter(Protocol):
    @property
    def name(self) -> str:
        """The encoding ("o200k_base", "cl100k_base") or "heuristic"."""
        ...

    def count(self, text: str) -> int: ...


@dataclass(frozen=True)
class HeuristicCounter:
    """About four characters per token, rounded up: the classic estimate, no vocabulary."""

    name: str = "heuristic"

    def count(self, text: str) -> int:
        return (len(text) + 3) // 4


def content_tokens(content: Content, counter: TokenCounter) -> int:
    if isinstance(content, str):
        return counter.count(content)
    total = 0
    for part in content:
        if part.get("type") == "text":
            total += counter.count(str(part.get("text", "")))
        else:
            total += IMAGE_TOKENS_LOW if part.get("detail") == "low" else IMAGE_TOKENS
    return total


def call_tokens(call: ToolCall, counter: TokenCounter) -> int:
    return (
        PER_TOOL_CALL
        + counter.count(call.id)
        + counter.count(call.name)
        + counter.count(canonical_json(call.arguments))
    )


_ROLE_TOKENS: dict[tuple[str, str], int] = {}


def message_overhead(role: str, counter: TokenCounter) -> int:
    """What wrapping content into one message costs, beyond the content itself."""
    key = (counter.name, role)
    if key not in _ROLE_TOKENS:  # a handful of roles per encoding: tokenize each once
        _ROLE_TOKENS[key] = counter.count(role)
    return PER_MESSAGE + _ROLE_TOKENS[key]


def name_tokens(name: str | None, counter: TokenCounter) -> int:
    return PER_NAME + counter.count(name) if name else 0


def message_tokens(message: Message, counter: TokenCounter) -> int:
    total = message_overhead(message.role, counter) + content_tokens(message.content, counter)
    total += name_tokens(message.name, counter)
    total += sum(call_tokens(c, counter) for c in message.tool_calls)
    if message.tool_call_id is not None:
        total += counter.count(message.tool_call_id)
    return total


def tools_tokens(tools: Iterable[ToolSpec], counter: TokenCounter) -> int:
    return sum(
        PER_TOOL_DEFINITION
        + counter.count(
            canonical_json(
                {"name": t.name, "description": t.description, "parameters": t.parameters}
            )
        )
        for t in tools
    )


def request_tokens(
    messages: Sequence[Message], tools: Sequence[ToolSpec], counter: TokenCounter
) -> int:
    """The whole request, counted from its messages: the reference the projector must match."""
    return (
        REPLY_PRIMING
        + sum(message_tokens(m, counter) for m in messages)
        + tools_tokens(tools, counter)
    )


def entry_tokens(
    kind: EntryKind, payload: dict[str, Any], refs: dict[str, Any], counter: TokenCounter
) -> int:
    """An entry's share of any request it appears in, without the per-message overhead.

    Stored as the entry's token_count when it is appended, so a projection adds counts instead
    of re-tokenizing history.
    """
    if kind == EntryKind.MESSAGE:
        content = payload["content"]
        parts = content if isinstance(content, str) else tuple(content)
        return content_tokens(parts, counter) + name_tokens(payload.get("name"), counter)
    if kind == EntryKind.TOOL_CALL:
        call = ToolCall(str(refs.get("tool_call_id", "")), payload["name"], payload["arguments"])
        return call_tokens(call, counter)
    if kind == EntryKind.TOOL_RESULT:
        return counter.count(result_text(payload.get("content"))) + counter.count(
            str(refs.get("tool_call_id", ""))
        )
    if kind == EntryKind.SUMMARY:
        return counter.count(str(payload["content"]))
    return 0  # run records, usage, errors, rollbacks: never sent to a model
