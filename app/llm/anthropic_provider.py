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

Reasoning is extended thinking: `thinking: {type: enabled, budget_tokens}`, with max_tokens the
budget plus the answer's own cap (the API counts thinking in max_tokens and requires it above
the budget). Thinking blocks stream as ReasoningDelta pieces, then, once closed, as one
ReasoningBlock: the thinking with its signature (thinking_delta, signature_delta), or a
redacted_thinking block's data, byte for byte, since the API checks them when they come back
in a tool loop (app.core.formats.to_anthropic sends them).

As in the OpenAI provider, the SDK makes the call; the streamed body is read here, its events by
app/llm/sse.py and each event's JSON by _State.read, not as the SDK's pydantic models.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import anthropic
import httpx2

from app.core.formats import to_anthropic
from app.core.output_schema import ResponseFormat
from app.core.reasoning import DEFAULT_ANSWER_TOKENS
from app.core.tool_choice import anthropic_tool_choice
from app.core.usage import UsageReport
from app.llm.base import (
    ErrorKind,
    Finish,
    ModelRequest,
    ProviderError,
    ReasoningBlock,
    ReasoningDelta,
    StreamEvent,
    TextDelta,
    ToolCallDelta,
    classified,
    transport_failure,
)
from app.llm.catalog import INTERLEAVED_THINKING_BETA, interleaves_thinking
from app.llm.openai_provider import kind_for_status
from app.llm.sse import server_events

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
            api_key=api_key,
            base_url=base_url,
            max_retries=0,
            timeout=timeout,
            # aiohttp's pool and parser (C) under the SDK: see app/llm/sse.py.
            http_client=anthropic.DefaultAioHttpClient(),
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
        # As in the OpenAI provider: cast_to=object has the SDK hand over each event as parsed
        # JSON rather than build a pydantic model of it. The body is create()'s, in its order.
        # Anthropic requires a cap; requests that set none get the default one.
        answer = request.max_output_tokens or DEFAULT_ANSWER_TOKENS
        reasoning = request.reasoning
        if reasoning is not None and _loop_without_thinking(wire["messages"]):
            # A tool loop that began without thinking (reasoning was off, then turned on) goes
            # on without: the API refuses thinking when the loop's turn has none to send back.
            reasoning = None
        body: dict[str, Any] = {
            "max_tokens": answer + (reasoning.budget if reasoning else 0),
            "messages": wire["messages"],
            "model": request.model,
        }
        if request.response_format is not None:
            body["output_config"] = {"format": output_format(request.response_format)}
        body["stream"] = True
        if "system" in wire:
            body["system"] = wire["system"]
        if reasoning is not None:
            body["thinking"] = {"type": "enabled", "budget_tokens": reasoning.budget}
        if choice is not None:
            body["tool_choice"] = choice
        headers: dict[str, str] = {}
        if "tools" in wire:
            body["tools"] = wire["tools"]
            if reasoning is not None and interleaves_thinking(f"anthropic:{request.model}"):
                # The model thinks between its tool calls too (after each result it reads).
                headers["anthropic-beta"] = INTERLEAVED_THINKING_BETA
        events = await self._client.post(
            "/v1/messages",
            body=body,
            options={"headers": headers},
            cast_to=object,
            stream=True,
            stream_cls=anthropic.AsyncStream[object],
        )
        state = _State()
        async with events:
            async for event in _events(events.response):
                for out in state.read(event):
                    yield out
        if state.stop_reason is None:
            # A body that ends cleanly but unfinished must not pass for a complete answer.
            raise ProviderError("server", "the stream ended without a stop reason")
        yield state.usage()
        yield Finish(state.stop_reason)


async def _events(response: httpx2.Response) -> AsyncIterator[object]:
    """The streamed events as parsed JSON, as the SDK would hand them over: pings and unnamed
    events skipped, an `event: error` raised as the SDK raises it (an APIStatusError whose body
    is the error, with the stream's 200 status)."""
    async for name, data in server_events(response):
        if name == "error":
            body: object = data
            try:
                body = json.loads(data)
                message = f"{body}"
            except ValueError:
                message = data or f"Error code: {response.status_code}"
            raise anthropic.APIStatusError(message, response=response, body=body)
        if not name or name == "ping" or not data:
            continue
        yield json.loads(data)


def output_format(format: ResponseFormat) -> dict[str, Any]:
    """A JSON Schema format as Anthropic's structured outputs take it (output_config.format):
    the schema as the SDK transforms it, the constraints the API does not enforce (numeric
    bounds, patterns it cannot compile) moved into descriptions. The run still checks the
    answer against the whole schema."""
    return {"type": "json_schema", "schema": anthropic.transform_schema(format.schema_)}


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
    # Open reasoning blocks by index: their part as received so far (pieces concatenated).
    reasoning: dict[int, dict[str, str]] = field(default_factory=dict)

    def read(self, event: object) -> list[StreamEvent]:
        """One streamed event (parsed JSON); ProviderError("bad_response") when it is not one
        of the Messages API's. Event and block types it does not know are skipped, as are
        parts it does not use; a part of the wrong type is never guessed at."""
        if type(event) is not dict:
            raise _bad(event)
        kind = event.get("type")
        if kind == "content_block_delta":
            delta = event.get("delta")
            if type(delta) is not dict:
                raise _bad(event)
            delta_type = delta.get("type")
            if delta_type == "text_delta":
                text = delta.get("text")
                if type(text) is not str:
                    raise _bad(event)
                return [TextDelta(text)] if text else []
            if delta_type == "input_json_delta":
                index = _index(event)
                partial = delta.get("partial_json")
                if type(partial) is not str:
                    raise _bad(event)
                if not partial:
                    return []
                self.empty_tool_blocks.discard(index)
                return [ToolCallDelta(index, None, None, partial)]
            if delta_type in ("thinking_delta", "signature_delta"):
                return self._reasoning_delta(event, delta, str(delta_type))
            if type(delta_type) is not str:
                raise _bad(event)
        elif kind == "content_block_start":
            index = _index(event)
            block = event.get("content_block")
            if type(block) is not dict:
                raise _bad(event)
            if block.get("type") == "tool_use":
                call_id, name = block.get("id"), block.get("name")
                if type(call_id) is not str or type(name) is not str:
                    raise _bad(event)
                self.empty_tool_blocks.add(index)
                return [ToolCallDelta(index, call_id, name, "")]
            if block.get("type") == "thinking":
                thinking, signature = block.get("thinking", ""), block.get("signature", "")
                if type(thinking) is not str or type(signature) is not str:
                    raise _bad(event)
                part = {"type": "thinking", "thinking": thinking, "signature": signature}
                self.reasoning[index] = part
                return [ReasoningDelta(index, thinking)] if thinking else []
            if block.get("type") == "redacted_thinking":
                data = block.get("data")
                if type(data) is not str or not data:
                    raise _bad(event)
                self.reasoning[index] = {"type": "redacted_thinking", "data": data}
        elif kind == "content_block_stop":
            index = _index(event)
            if index in self.reasoning:
                return [self._reasoning_block(index)]
            if index in self.empty_tool_blocks:
                # A call without parameters streams no JSON at all; OpenAI's would say "{}".
                self.empty_tool_blocks.discard(index)
                return [ToolCallDelta(index, None, None, "{}")]
        elif kind == "message_start":
            message = event.get("message")
            if type(message) is not dict:
                raise _bad(event)
            self._count(message.get("usage"), event)
        elif kind == "message_delta":
            delta = event.get("delta")
            if type(delta) is not dict:
                raise _bad(event)
            self._count(event.get("usage"), event)
            stop_reason = delta.get("stop_reason")
            if stop_reason is not None:
                if type(stop_reason) is not str:
                    raise _bad(event)
                self.stop_reason = stop_reason
        elif type(kind) is not str:
            raise _bad(event)
        return []

    def _reasoning_delta(
        self, event: dict[str, Any], delta: dict[str, Any], delta_type: str
    ) -> list[StreamEvent]:
        """A piece of an open thinking block's text or signature (appended as it comes)."""
        index = _index(event)
        field_name = "thinking" if delta_type == "thinking_delta" else "signature"
        piece = delta.get(field_name)
        if type(piece) is not str:
            raise _bad(event)
        part = self.reasoning.get(index)
        if part is None or part["type"] != "thinking":
            return []  # of no thinking block: nothing to keep it with
        part[field_name] += piece
        if field_name == "thinking" and piece:
            return [ReasoningDelta(index, piece)]
        return []

    def _reasoning_block(self, index: int) -> ReasoningBlock:
        part = self.reasoning.pop(index)
        if part["type"] == "thinking" and not part["signature"]:
            # Unsigned, it could never be sent back: the API would refuse the next request.
            raise ProviderError("bad_response", "a thinking block ended without its signature")
        return ReasoningBlock(index, dict(part))

    def _count(self, usage: object, event: object) -> None:
        # message_start and message_delta both carry usage; later counts are cumulative.
        if type(usage) is not dict:
            raise _bad(event)
        counts = (
            usage.get("input_tokens"),
            usage.get("cache_read_input_tokens"),
            usage.get("cache_creation_input_tokens"),
            usage.get("output_tokens"),
        )
        if any(count is not None and type(count) is not int for count in counts):
            raise _bad(event)
        self.input_tokens = counts[0] or self.input_tokens
        self.cache_read = counts[1] or self.cache_read
        self.cache_write = counts[2] or self.cache_write
        self.output_tokens = counts[3] or self.output_tokens

    def usage(self) -> UsageReport:
        prompt = self.input_tokens + self.cache_read + self.cache_write
        return UsageReport(
            prompt, self.output_tokens, self.cache_read, cache_write_tokens=self.cache_write
        )


def _loop_without_thinking(messages: list[dict[str, Any]]) -> bool:
    """The request goes on with a tool loop (its last message returns tool results) whose
    final assistant turn does not start with thinking."""
    if len(messages) < 2:
        return False
    last, turn = messages[-1]["content"], messages[-2]["content"]
    if not isinstance(last, list) or not any(b.get("type") == "tool_result" for b in last):
        return False
    first = turn[0].get("type") if isinstance(turn, list) and turn else "text"
    return first not in ("thinking", "redacted_thinking")


def _index(event: dict[str, Any]) -> int:
    index = event.get("index")
    if type(index) is not int:
        raise _bad(event)
    return index


def _bad(event: object) -> ProviderError:
    shown = repr(event)
    if len(shown) > 200:
        shown = shown[:200] + "..."
    return ProviderError(
        "bad_response", f"the provider streamed an event that is not the Messages API's: {shown}"
    )


def classify_anthropic(error: anthropic.APIError) -> ProviderError:
    """The ProviderError for an SDK error, raised before the stream or in it."""
    if isinstance(error, anthropic.APIConnectionError):  # a timeout is one too
        return transport_failure(error, isinstance(error, anthropic.APITimeoutError))
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
