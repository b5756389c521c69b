"""OpenAI Responses API streaming (the reasoning models' API), as the same neutral events as the
Chat Completions provider.

Requests are stateless (`store: false`) and ask for each reasoning item's encrypted content
(`include: ["reasoning.encrypted_content"]`): the item, closed, comes out as one ReasoningBlock
({"type": "reasoning", "id", "encrypted_content", "summary"}), byte for byte, which the
projection sends back within its tool loop as the API documents (app.core.formats
.to_openai_responses); its summary streams as ReasoningDelta pieces while it is written, one
block per reasoning item (the item's output_index), summary parts apart by a blank line.
Events: text, tool-call (function_call items, by output_index) and reasoning deltas in the order
the model wrote them, then one UsageReport (reasoning tokens apart), then Finish last. Every
failure, before or during the stream (an `error` event, `response.failed`), is a ProviderError
classified as the Chat Completions provider's are. Retries are the router's job.

The request body is built by request_body (one field per concern) for others to extend.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import openai
from openai.types.responses import (
    ResponseCompletedEvent,
    ResponseErrorEvent,
    ResponseFailedEvent,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseFunctionToolCall,
    ResponseIncompleteEvent,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
    ResponseReasoningItem,
    ResponseReasoningSummaryPartAddedEvent,
    ResponseReasoningSummaryTextDeltaEvent,
    ResponseTextDeltaEvent,
    ResponseUsage,
)

from app.core.formats import to_openai_responses
from app.core.reasoning import effort_of
from app.core.tool_choice import openai_fields
from app.core.usage import UsageReport
from app.llm.base import (
    Finish,
    ModelRequest,
    ProviderError,
    ReasoningBlock,
    ReasoningDelta,
    StreamEvent,
    TextDelta,
    ToolCallDelta,
    classified,
)
from app.llm.openai_provider import classify_openai, kind_for_hint
from app.llm.tokenizers import stored_counter

ENCRYPTED_REASONING = "reasoning.encrypted_content"
# Why a response ended incomplete, as a finish reason (app.llm.base._NEUTRAL_FINISH).
INCOMPLETE_REASONS = {"max_output_tokens": "length", "content_filter": "content_filter"}


def request_body(request: ModelRequest, reasons: bool = True) -> dict[str, Any]:
    """The responses.create arguments (stream aside) for `request`; `reasons`: the model is a
    reasoning model (others refuse to be asked for encrypted reasoning)."""
    wire = to_openai_responses(request.messages, request.tools)
    body: dict[str, Any] = {
        "model": request.model,
        "input": wire["input"],
        # Stateless: nothing kept at OpenAI; the journal is the history, reasoning included.
        "store": False,
    }
    if reasons:
        # Even with reasoning off, a reasoning model reasons (at its default effort): its items
        # are kept all the same, to go back within their tool loop.
        body["include"] = [ENCRYPTED_REASONING]
    if request.reasoning is not None:
        body["reasoning"] = {"effort": effort_of(request.reasoning), "summary": "auto"}
    if request.max_output_tokens is not None:
        body["max_output_tokens"] = request.max_output_tokens
    if request.temperature is not None:
        body["temperature"] = request.temperature
    if request.cache_key is not None:
        body["prompt_cache_key"] = request.cache_key
    if request.response_format is not None:
        # The Responses API takes the chat format's json_schema flattened under text.format.
        spec = request.response_format.as_json()["json_schema"]
        body["text"] = {"format": {"type": "json_schema", **spec}}
    if "tools" in wire:
        body["tools"] = wire["tools"]
        choice = openai_fields(request.tool_choice, request.parallel_tool_calls, True)
        if "tool_choice" in choice:
            named = choice["tool_choice"]
            # Chat Completions nests a named tool's name under "function"; Responses does not.
            if isinstance(named, dict):
                named = {"type": "function", "name": named["function"]["name"]}
            body["tool_choice"] = named
        if "parallel_tool_calls" in choice:
            body["parallel_tool_calls"] = choice["parallel_tool_calls"]
    return body


class OpenAIResponsesProvider:
    """OpenAI's Responses API (or a server speaking it). `reasons` says which models (by their
    name) are reasoning models: the catalog's can_reason; by default all."""

    def __init__(
        self,
        api_key: str,
        base_url: str | None = None,
        timeout: float = 120.0,
        reasons: Callable[[str], bool] = lambda model: True,
    ) -> None:
        self._client = openai.AsyncOpenAI(
            api_key=api_key,
            base_url=base_url,
            max_retries=0,
            timeout=timeout,
            # aiohttp's pool and parser (C) under the SDK: see app/llm/sse.py.
            http_client=openai.DefaultAioHttpClient(),
        )
        self._reasons = reasons

    @property
    def base_url(self) -> str:
        return str(self._client.base_url)

    async def aclose(self) -> None:
        await self._client.close()

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        return classified(self._stream(request), openai.APIError, classify_openai)

    async def _stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        body = request_body(request, self._reasons(request.model))
        events = await self._client.responses.create(stream=True, **body)
        state = _State()
        async with events:
            async for event in events:
                try:
                    read = state.read(event)
                except (AttributeError, TypeError, KeyError) as error:
                    raise _bad(event) from error
                for out in read:
                    yield out
        if state.finish is None:
            # A body that ends cleanly but unfinished must not pass for a complete answer.
            raise ProviderError("server", "the stream ended without response.completed")
        yield state.usage or _estimated(body, state.output)
        yield Finish(state.finish)


@dataclass
class _State:
    """What the stream said so far that only counts at its end."""

    finish: str | None = None
    usage: UsageReport | None = None
    calls: int = 0
    # Function calls (by output_index) whose arguments have not had a delta yet.
    argumentless: set[int] = field(default_factory=set)
    output: list[str] = field(default_factory=list)  # to count when no usage is reported

    def read(self, event: object) -> list[StreamEvent]:
        """One streamed event as neutral events; event types it does not use are skipped."""
        if isinstance(event, ResponseTextDeltaEvent):
            self.output.append(event.delta)
            return [TextDelta(event.delta)] if event.delta else []
        if isinstance(event, ResponseReasoningSummaryTextDeltaEvent):
            self.output.append(event.delta)
            return [ReasoningDelta(event.output_index, event.delta)] if event.delta else []
        if isinstance(event, ResponseReasoningSummaryPartAddedEvent):
            # A summary's parts are paragraphs of one block.
            return [ReasoningDelta(event.output_index, "\n\n")] if event.summary_index else []
        if isinstance(event, ResponseFunctionCallArgumentsDeltaEvent):
            self.output.append(event.delta)
            if not event.delta:
                return []
            self.argumentless.discard(event.output_index)
            return [ToolCallDelta(event.output_index, None, None, event.delta)]
        if isinstance(event, ResponseOutputItemAddedEvent):
            item = event.item
            if isinstance(item, ResponseFunctionToolCall):
                self.calls += 1
                self.argumentless.add(event.output_index)
                self.output.append(item.name)
                return [ToolCallDelta(event.output_index, item.call_id, item.name, "")]
            return []
        if isinstance(event, ResponseOutputItemDoneEvent):
            return self._item_done(event)
        if isinstance(event, ResponseCompletedEvent):
            self.usage = _usage(event.response.usage)
            self.finish = "tool_calls" if self.calls else "stop"
            return []
        if isinstance(event, ResponseIncompleteEvent):
            details = event.response.incomplete_details
            reason = details.reason if details is not None else None
            self.usage = _usage(event.response.usage)
            self.finish = INCOMPLETE_REASONS.get(reason or "", "length")
            return []
        if isinstance(event, ResponseFailedEvent):
            error = event.response.error
            code = error.code if error is not None else ""
            message = error.message if error is not None else "the response failed"
            raise ProviderError(kind_for_hint(str(code)), message)
        if isinstance(event, ResponseErrorEvent):
            raise ProviderError(kind_for_hint(f"{event.code or ''} {event.message}"), event.message)
        return []

    def _item_done(self, event: ResponseOutputItemDoneEvent) -> list[StreamEvent]:
        item = event.item
        if isinstance(item, ResponseReasoningItem):
            if not item.encrypted_content:
                # Without it the item could never go back, and the tool loop's next request
                # would be refused.
                raise ProviderError(
                    "bad_response", f"reasoning item {item.id} came without its encrypted content"
                )
            part = {
                "type": "reasoning",
                "id": item.id,
                "encrypted_content": item.encrypted_content,
                "summary": [{"type": "summary_text", "text": s.text} for s in item.summary],
            }
            return [ReasoningBlock(event.output_index, part)]
        if isinstance(item, ResponseFunctionToolCall) and event.output_index in self.argumentless:
            # No argument deltas: the done item carries them whole ("{}" when there are none).
            self.argumentless.discard(event.output_index)
            return [ToolCallDelta(event.output_index, None, None, item.arguments or "{}")]
        return []


def _usage(usage: ResponseUsage | None) -> UsageReport | None:
    if usage is None:
        return None
    cached = usage.input_tokens_details.cached_tokens if usage.input_tokens_details else 0
    reasoning = usage.output_tokens_details.reasoning_tokens if usage.output_tokens_details else 0
    return UsageReport(
        usage.input_tokens, usage.output_tokens, cached or 0, reasoning_tokens=reasoning or 0
    )


def _estimated(body: dict[str, Any], output: list[str]) -> UsageReport:
    """The usage of a response that reported none, counted with the stored tokenizer."""
    counter = stored_counter()
    prompt = counter.count(json.dumps(body["input"], ensure_ascii=False))
    return UsageReport(prompt, counter.count("".join(output)), estimated=True)


def _bad(event: object) -> ProviderError:
    shown = repr(event)
    if len(shown) > 200:
        shown = shown[:200] + "..."
    return ProviderError(
        "bad_response", f"the provider streamed an event that is not the Responses API's: {shown}"
    )
