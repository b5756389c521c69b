"""Anthropic Messages streaming, as the same neutral events as the OpenAI provider.

Events: text and tool-call deltas (a tool call's pieces share its content block index), then
one UsageReport, then Finish(stop_reason) last. Usage follows the OpenAI convention the rest
of Threadline counts with: input_tokens is the whole prompt, cached tokens included (Anthropic
reports the uncached, cache-read and cache-write parts separately); the cache-write part is
reported as cache_write_tokens.

The request's cache_breakpoints become cache_control marks (see app.core.formats.to_anthropic):
Anthropic caches a prompt prefix only where a block asks for it.

request.temperature is not sent: the Messages API version this SDK speaks has no such
parameter.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, cast

import anthropic
from anthropic.types import MessageDeltaUsage, RawMessageStreamEvent, Usage

from app.core.formats import to_anthropic
from app.core.tool_choice import anthropic_tool_choice
from app.llm.base import (
    ErrorKind,
    Finish,
    ModelRequest,
    ProviderError,
    StreamEvent,
    TextDelta,
    ToolCallDelta,
    UsageReport,
    classified,
)
from app.llm.openai_provider import kind_for_status

DEFAULT_MAX_TOKENS = 4096  # Anthropic requires a cap; requests that set none get this one

# Anthropic's error types (in error bodies and stream error events) as error kinds.
ERROR_TYPES: dict[str, ErrorKind] = {
    "overloaded_error": "overloaded",
    "rate_limit_error": "rate_limited",
    "api_error": "server",
    "timeout_error": "timeout",
    "invalid_request_error": "bad_request",
    "request_too_large": "bad_request",
    "authentication_error": "auth",
    "permission_error": "auth",
    "billing_error": "auth",
    "not_found_error": "not_found",
}


class AnthropicProvider:
    def __init__(self, api_key: str, base_url: str | None = None, timeout: float = 120.0) -> None:
        self._client = anthropic.AsyncAnthropic(
            api_key=api_key, base_url=base_url, max_retries=0, timeout=timeout
        )

    @property
    def base_url(self) -> str:
        return str(self._client.base_url)

    async def aclose(self) -> None:
        await self._client.close()

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        return classified(self._stream(request), anthropic.APIError, classify_anthropic)

    async def _stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        wire = to_anthropic(request.messages, request.tools, request.cache_breakpoints)
        choice = anthropic_tool_choice(
            request.tool_choice, request.parallel_tool_calls, "tools" in wire
        )
        events = await self._client.messages.create(
            model=request.model,
            max_tokens=request.max_output_tokens or DEFAULT_MAX_TOKENS,
            messages=cast(Any, wire["messages"]),
            system=cast(Any, wire["system"]) if "system" in wire else anthropic.omit,
            tools=cast(Any, wire["tools"]) if "tools" in wire else anthropic.omit,
            tool_choice=cast(Any, choice) if choice is not None else anthropic.omit,
            stream=True,
        )
        state = _State()
        async with events:
            async for event in events:
                for out in state.read(event):
                    yield out
        if state.stop_reason is None:
            # A body that ends cleanly but unfinished must not pass for a complete answer.
            raise ProviderError("server", "the stream ended without a stop reason")
        yield state.usage()
        yield Finish(state.stop_reason)


@dataclass
class _State:
    """What the stream said so far that only counts at its end."""

    input_tokens: int = 0
    cache_read: int = 0
    cache_write: int = 0
    output_tokens: int = 0
    stop_reason: str | None = None
    # Tool-use blocks (by index) whose input has not had a fragment yet.
    empty_tool_blocks: set[int] = field(default_factory=set)

    def read(self, event: RawMessageStreamEvent) -> list[StreamEvent]:
        if event.type == "message_start":
            self._count(event.message.usage)
        elif event.type == "content_block_start":
            block = event.content_block
            if block.type == "tool_use":
                self.empty_tool_blocks.add(event.index)
                return [ToolCallDelta(event.index, block.id, block.name, "")]
        elif event.type == "content_block_delta":
            delta = event.delta
            if delta.type == "text_delta" and delta.text:
                return [TextDelta(delta.text)]
            if delta.type == "input_json_delta" and delta.partial_json:
                self.empty_tool_blocks.discard(event.index)
                return [ToolCallDelta(event.index, None, None, delta.partial_json)]
        elif event.type == "content_block_stop":
            if event.index in self.empty_tool_blocks:
                # A call without parameters streams no JSON at all; OpenAI's would say "{}".
                self.empty_tool_blocks.discard(event.index)
                return [ToolCallDelta(event.index, None, None, "{}")]
        elif event.type == "message_delta":
            self._count(event.usage)
            if event.delta.stop_reason is not None:
                self.stop_reason = event.delta.stop_reason
        return []

    def _count(self, usage: Usage | MessageDeltaUsage) -> None:
        # message_start and message_delta both carry usage; later counts are cumulative.
        self.input_tokens = usage.input_tokens or self.input_tokens
        self.cache_read = usage.cache_read_input_tokens or self.cache_read
        self.cache_write = usage.cache_creation_input_tokens or self.cache_write
        self.output_tokens = usage.output_tokens or self.output_tokens

    def usage(self) -> UsageReport:
        prompt = self.input_tokens + self.cache_read + self.cache_write
        return UsageReport(
            prompt, self.output_tokens, self.cache_read, cache_write_tokens=self.cache_write
        )


def classify_anthropic(error: anthropic.APIError) -> ProviderError:
    """The ProviderError for an SDK error, raised before the stream or in it."""
    if isinstance(error, anthropic.APITimeoutError):
        return ProviderError("timeout", error.message)
    if isinstance(error, anthropic.APIConnectionError):
        return ProviderError("connection", error.message)
    error_type = _error_type(error.body)
    message = _error_message(error.body) or error.message
    if isinstance(error, anthropic.APIStatusError) and error.status_code >= 400:
        status = error.status_code
        return ProviderError(kind_for_status(status, error_type), message, status)
    # An `event: error` inside a 200 stream: its type is all there is to go by.
    return ProviderError(ERROR_TYPES.get(error_type, "server"), message)


def _error_type(body: object) -> str:
    error = body.get("error") if isinstance(body, dict) else None
    kind = error.get("type") if isinstance(error, dict) else None
    return kind if isinstance(kind, str) else ""


def _error_message(body: object) -> str | None:
    error = body.get("error") if isinstance(body, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    return message if isinstance(message, str) else None
