"""OpenAI Chat Completions streaming (also any OpenAI-compatible server: vLLM, Ollama, llama.cpp).

Events come out as text/tool-call deltas (and reasoning where a compatible server streams
it), then one UsageReport, then Finish last. A server that reports no usage (several
OpenAI-compatible ones ignore stream_options) gets its usage counted here with the stored
tokenizer and marked estimated, never left at 0. Every failure, before or
during the stream, is raised as a ProviderError.
Retries are the router's job, so the SDK's own are off. The SDK makes the call (the request,
auth, a refusal's error); the streamed body is read here, its events by app/llm/sse.py and each
chunk's JSON by read_chunk, not as the SDK's pydantic models through its line decoder: those
cost more than all the rest of a stream.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any, cast

import httpx2
import openai

from app.core.formats import openai_request_tokens, to_openai
from app.core.tool_choice import openai_fields
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
from app.llm.sse import server_events
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
            api_key=api_key,
            base_url=base_url,
            max_retries=0,
            timeout=timeout,
            # aiohttp's pool and parser (C) under the SDK: see app/llm/sse.py.
            http_client=openai.DefaultAioHttpClient(),
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
        # The SDK's own create() would build a pydantic ChatCompletionChunk per chunk, the
        # largest cost of a stream; posting with stream=True has the SDK make the call and
        # hand over the open response, whose body _chunks reads.
        chunks = await self._client.post(
            "/chat/completions",
            body=self._body(request, wire),
            cast_to=object,
            options={"security": {"bearer_auth": True}},
            stream=True,
            stream_cls=openai.AsyncStream[object],
        )
        finish: str | None = None
        usage: UsageReport | None = None
        output: list[str] = []  # what the model wrote, to count when the server does not
        thought = _Thought()
        async with chunks:
            async for chunk in _chunks(chunks.response):
                events, reported = read_chunk(chunk)
                for event in events:
                    if isinstance(event, Finish):
                        finish = event.reason
                        continue
                    if isinstance(event, ReasoningDelta):
                        output.append(event.text)
                        yield thought.add(event.text)
                        continue
                    if isinstance(event, TextDelta):
                        output.append(event.text)
                    else:
                        output.append((event.name or "") + event.arguments)
                    if thought.open:
                        yield thought.close()
                    yield event
                if reported is not None:
                    usage = reported
        if finish is None:
            # A body that ends cleanly but unfinished must not pass for a complete answer.
            raise ProviderError("server", "the stream ended without a finish reason")
        if thought.open:
            yield thought.close()
        yield usage if usage is not None else estimated_usage(wire, "".join(output))
        yield Finish(finish)

    def _body(self, request: ModelRequest, wire: dict[str, Any]) -> dict[str, Any]:
        """The request body, field for field what the SDK's chat.completions.create sends
        (tests/llm/test_openai_provider.py compares the two)."""
        # In create()'s order, so that even the bytes are the same.
        body: dict[str, Any] = {"model": request.model, "stream": True}
        body["messages"] = wire["messages"]
        cap = self._output_cap(request)
        if cap is not None:
            body["max_tokens" if self._legacy_max_tokens else "max_completion_tokens"] = cap
        choice = openai_fields(request.tool_choice, request.parallel_tool_calls, "tools" in wire)
        if "parallel_tool_calls" in choice:
            body["parallel_tool_calls"] = choice["parallel_tool_calls"]
        if self._send_cache_key and request.cache_key is not None:
            body["prompt_cache_key"] = request.cache_key
        if request.response_format is not None:
            body["response_format"] = request.response_format.as_json()
        body["stream_options"] = {"include_usage": True}
        if request.temperature is not None:
            body["temperature"] = request.temperature
        if "tool_choice" in choice:
            body["tool_choice"] = choice["tool_choice"]
        if "tools" in wire:
            body["tools"] = wire["tools"]
        return body


async def _chunks(response: httpx2.Response) -> AsyncIterator[object]:
    """The streamed chunks as parsed JSON, read to the end of the body (so that its connection
    is kept for the next request); an error sent inside the stream is raised as the SDK raises
    it (an APIError whose body is the error)."""
    done = False
    async for _name, data in server_events(response):
        if done:
            continue
        if data.startswith("[DONE]"):
            done = True
            continue
        chunk = json.loads(data)
        if type(chunk) is dict and chunk.get("error"):
            error = chunk["error"]
            said = error.get("message") if type(error) is dict else None
            message = said if type(said) is str and said else "An error occurred during streaming"
            raise openai.APIError(message, response.request, body=error)
        yield chunk


class _Thought:
    """Readable reasoning streamed in chat-completion chunks, as blocks: one runs until the
    model writes something else, then is kept whole as a `reasoning_text` part (in its place
    among the text and calls). Those APIs take it back in no request (DeepSeek refuses it), so
    it is kept for the record and shown, never sent."""

    def __init__(self) -> None:
        self.index = 0
        self.pieces: list[str] = []

    @property
    def open(self) -> bool:
        return bool(self.pieces)

    def add(self, text: str) -> ReasoningDelta:
        self.pieces.append(text)
        return ReasoningDelta(self.index, text)

    def close(self) -> ReasoningBlock:
        block = ReasoningBlock(self.index, {"type": "reasoning_text", "text": "".join(self.pieces)})
        self.index, self.pieces = self.index + 1, []
        return block


# What a chunk holds, as read: the events it carries and the usage it reports, if any.
Read = tuple[list[TextDelta | ReasoningDelta | ToolCallDelta | Finish], UsageReport | None]


def read_chunk(chunk: object) -> Read:
    """One streamed chunk (parsed JSON) as events; ProviderError("bad_response") when it is not
    a chat.completion.chunk. A part left out or null is read as absent (choices and delta too,
    which the API always sends: a server that leaves them out has said nothing); a part of the
    wrong type is never guessed at. Choices other than the first (index 0) are skipped."""
    if type(chunk) is not dict:
        raise _bad(chunk)
    choices = chunk.get("choices")
    reported = chunk.get("usage")
    if not choices:
        if choices is None or choices == []:
            return [], None if reported is None else _usage(reported, chunk)
        raise _bad(chunk)
    if type(choices) is not list:
        raise _bad(chunk)
    events: list[TextDelta | ReasoningDelta | ToolCallDelta | Finish] = []
    for choice in choices:
        if type(choice) is not dict:
            raise _bad(chunk)
        index = choice.get("index")
        if type(index) is not int:
            raise _bad(chunk)
        if index != 0:
            continue
        delta = choice.get("delta")
        if delta is not None:
            if type(delta) is not dict:
                raise _bad(chunk)
            # OpenAI-compatible servers stream readable reasoning beside the content:
            # reasoning_content (DeepSeek, vLLM, llama.cpp) or reasoning (OpenRouter, newer vLLM).
            thought = delta.get("reasoning_content")
            if thought is None:
                thought = delta.get("reasoning")
            if thought:
                if type(thought) is not str:
                    raise _bad(chunk)
                events.append(ReasoningDelta(0, thought))
            elif thought is not None and thought != "":
                raise _bad(chunk)
            content = delta.get("content")
            if content:
                if type(content) is not str:
                    raise _bad(chunk)
                events.append(TextDelta(content))
            elif content is not None and content != "":
                raise _bad(chunk)
            calls = delta.get("tool_calls")
            if calls:
                if type(calls) is not list:
                    raise _bad(chunk)
                for call in calls:
                    events.append(_tool_call_delta(call, chunk))
            elif calls is not None and calls != []:
                raise _bad(chunk)
        finish = choice.get("finish_reason")
        if finish is not None:
            if type(finish) is not str:
                raise _bad(chunk)
            events.append(Finish(finish))
    return events, None if reported is None else _usage(reported, chunk)


def _tool_call_delta(call: object, chunk: object) -> ToolCallDelta:
    if type(call) is not dict:
        raise _bad(chunk)
    index = call.get("index")
    call_id = call.get("id")
    function = call.get("function")
    if function is None:
        name = arguments = None
    elif type(function) is dict:
        name = function.get("name")
        arguments = function.get("arguments")
    else:
        raise _bad(chunk)
    if (
        type(index) is not int
        or not _optional_str(call_id)
        or not _optional_str(name)
        or not _optional_str(arguments)
    ):
        raise _bad(chunk)
    return ToolCallDelta(index, call_id, name, arguments or "")


def _usage(usage: object, chunk: object) -> UsageReport:
    if type(usage) is not dict:
        raise _bad(chunk)
    prompt = usage.get("prompt_tokens")
    completion = usage.get("completion_tokens")
    details = usage.get("prompt_tokens_details")
    cached: object = None
    if details is not None:
        if type(details) is not dict:
            raise _bad(chunk)
        cached = details.get("cached_tokens")
    # Of the completion, the reasoning tokens (OpenAI's reasoning models say how many).
    output_details = usage.get("completion_tokens_details")
    reasoning: object = None
    if output_details is not None:
        if type(output_details) is not dict:
            raise _bad(chunk)
        reasoning = output_details.get("reasoning_tokens")
    if type(prompt) is not int or type(completion) is not int or not _optional_int(cached):
        raise _bad(chunk)
    if not _optional_int(reasoning):
        raise _bad(chunk)
    return UsageReport(
        prompt,
        completion,
        cast(int | None, cached) or 0,
        reasoning_tokens=cast(int | None, reasoning) or 0,
    )


def _optional_str(value: object) -> bool:
    return value is None or type(value) is str


def _optional_int(value: object) -> bool:
    return value is None or type(value) is int


def _bad(chunk: object) -> ProviderError:
    shown = repr(chunk)
    if len(shown) > 200:
        shown = shown[:200] + "..."
    return ProviderError(
        "bad_response",
        f"the provider streamed a chunk that is not a chat.completion.chunk: {shown}",
    )


def estimated_usage(wire: dict[str, Any], output: str) -> UsageReport:
    """The usage of a call whose server reported none, counted with the stored tokenizer."""
    counter = stored_counter()
    return UsageReport(openai_request_tokens(wire, counter), counter.count(output), estimated=True)


def classify_openai(error: openai.APIError) -> ProviderError:
    """The ProviderError for an SDK error, raised before the stream or in it."""
    if isinstance(error, openai.APIConnectionError):  # a timeout is one too
        return transport_failure(error, isinstance(error, openai.APITimeoutError))
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
