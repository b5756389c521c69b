"""OpenAI Chat Completions streaming (also any OpenAI-compatible server: vLLM, Ollama, llama.cpp).

Events come out as text/tool-call deltas, then one UsageReport, then Finish last. A server that
reports no usage (several OpenAI-compatible ones ignore stream_options) gets its usage counted
here with the stored tokenizer and marked estimated, never left at 0. Every failure, before or
during the stream, is raised as a ProviderError.
Retries are the router's job, so the SDK's own are off.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, cast

import openai
from openai.types.chat import ChatCompletionChunk

from app.core.formats import openai_request_tokens, to_openai
from app.core.tool_choice import openai_fields
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
from app.llm.tokenizers import stored_counter


class OpenAIProvider:
    """One OpenAI(-compatible) endpoint.

    `legacy_max_tokens` sends the output cap as "max_tokens": OpenAI's current models take
    only "max_completion_tokens", but many compatible servers know only the older name.
    `output_limit` caps every answer (the endpoint's own limit); `answer_in_room` caps an answer
    the caller left uncapped at the room the projection kept for it (request.answer_room), so
    that a server with a small window is never asked for more than prompt and answer fit.
    `send_cache_key` sends request.cache_key as prompt_cache_key, which routes a thread's calls
    to the same prompt cache; OpenAI's own API only (compatible servers may refuse the field).
    """

    def __init__(
        self,
        api_key: str,
        base_url: str | None = None,
        timeout: float = 120.0,
        *,
        legacy_max_tokens: bool = False,
        output_limit: int | None = None,
        answer_in_room: bool = False,
        send_cache_key: bool = False,
    ) -> None:
        self._client = openai.AsyncOpenAI(
            api_key=api_key, base_url=base_url, max_retries=0, timeout=timeout
        )
        self._legacy_max_tokens = legacy_max_tokens
        self._output_limit = output_limit
        self._answer_in_room = answer_in_room
        self._send_cache_key = send_cache_key

    def _output_cap(self, request: ModelRequest) -> int | None:
        cap = request.max_output_tokens
        if cap is None and self._answer_in_room:
            cap = request.answer_room
        if self._output_limit is not None:
            cap = self._output_limit if cap is None else min(cap, self._output_limit)
        return cap

    @property
    def base_url(self) -> str:
        return str(self._client.base_url)

    async def aclose(self) -> None:
        await self._client.close()

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        return classified(self._stream(request), openai.APIError, classify_openai)

    async def _stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        wire = to_openai(request.messages, request.tools)
        limit = self._output_cap(request)
        cap = limit if limit is not None else openai.omit
        legacy = self._legacy_max_tokens
        cache_key = request.cache_key if self._send_cache_key else None
        choice = openai_fields(request.tool_choice, request.parallel_tool_calls, "tools" in wire)
        chunks = await self._client.chat.completions.create(
            model=request.model,
            messages=cast(Any, wire["messages"]),
            tools=cast(Any, wire["tools"]) if "tools" in wire else openai.omit,
            temperature=request.temperature if request.temperature is not None else openai.omit,
            stream=True,
            stream_options={"include_usage": True},
            max_completion_tokens=openai.omit if legacy else cap,
            max_tokens=cap if legacy else openai.omit,
            prompt_cache_key=cache_key if cache_key is not None else openai.omit,
            tool_choice=choice.get("tool_choice", openai.omit),
            parallel_tool_calls=choice.get("parallel_tool_calls", openai.omit),
        )
        finish: str | None = None
        usage: UsageReport | None = None
        output: list[str] = []  # what the model wrote, to count when the server does not
        async with chunks:
            async for chunk in chunks:
                for event in _chunk_events(chunk):
                    if isinstance(event, Finish):
                        finish = event.reason
                        continue
                    if isinstance(event, TextDelta):
                        output.append(event.text)
                    elif isinstance(event, ToolCallDelta):
                        output.append((event.name or "") + event.arguments)
                    yield event
                if chunk.usage is not None:
                    usage = _usage(chunk)
        if finish is None:
            # A body that ends cleanly but unfinished must not pass for a complete answer.
            raise ProviderError("server", "the stream ended without a finish reason")
        yield usage if usage is not None else estimated_usage(wire, "".join(output))
        yield Finish(finish)


def _chunk_events(chunk: ChatCompletionChunk) -> list[StreamEvent]:
    events: list[StreamEvent] = []
    for choice in chunk.choices:
        if choice.index != 0:
            continue
        delta = choice.delta
        if delta.content:
            events.append(TextDelta(delta.content))
        for call in delta.tool_calls or ():
            function = call.function
            events.append(
                ToolCallDelta(
                    index=call.index,
                    id=call.id,
                    name=function.name if function else None,
                    arguments=(function.arguments or "") if function else "",
                )
            )
        if choice.finish_reason is not None:
            events.append(Finish(choice.finish_reason))
    return events


def _usage(chunk: ChatCompletionChunk) -> UsageReport:
    usage = chunk.usage
    assert usage is not None
    details = usage.prompt_tokens_details
    cached = (details.cached_tokens or 0) if details is not None else 0
    return UsageReport(usage.prompt_tokens, usage.completion_tokens, cached)


def estimated_usage(wire: dict[str, Any], output: str) -> UsageReport:
    """The usage of a call whose server reported none, counted with the stored tokenizer."""
    counter = stored_counter()
    return UsageReport(openai_request_tokens(wire, counter), counter.count(output), estimated=True)


def classify_openai(error: openai.APIError) -> ProviderError:
    """The ProviderError for an SDK error, raised before the stream or in it."""
    if isinstance(error, openai.APITimeoutError):
        return ProviderError("timeout", error.message)
    if isinstance(error, openai.APIConnectionError):
        return ProviderError("connection", error.message)
    hint = f"{error.type or ''} {error.code or ''}"
    said = error.body.get("message") if isinstance(error.body, dict) else None
    message = said if isinstance(said, str) else error.message
    if isinstance(error, openai.APIStatusError | openai.APIResponseValidationError):
        status = error.status_code
        return ProviderError(kind_for_status(status, hint), message, status)
    # An error chunk inside a 200 stream: only its words say what it was.
    return ProviderError(kind_for_hint(f"{hint} {message}"), message)


def kind_for_status(status: int, hint: str = "") -> ErrorKind:
    """An HTTP error status as an error kind; `hint` is the body's error type/code.

    Shared by the Anthropic provider: both APIs use the statuses the same way.
    """
    hint = hint.lower()
    if status == 529 or "overloaded" in hint:
        return "overloaded"
    if "insufficient_quota" in hint:
        # A 429 that waiting does not cure: the account is out of credit.
        return "auth"
    if status == 429:
        return "rate_limited"
    if status in (401, 402, 403):
        return "auth"
    if status == 404:
        return "not_found"
    if status == 408:
        return "timeout"
    if status == 409 or status >= 500:
        return "server"
    if 400 <= status < 500:
        return "bad_request"
    return "server"


def kind_for_hint(hint: str) -> ErrorKind:
    """An error without a status (one reported inside a stream), by its type/code/message."""
    hint = hint.lower()
    if "overloaded" in hint:
        return "overloaded"
    if "rate_limit" in hint:
        return "rate_limited"
    if "invalid_request" in hint:
        return "bad_request"
    return "server"
