"""The provider interface: one streaming call, provider-neutral events, classified errors."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from app.core.content import unstorable
from app.core.entries import FinishReason
from app.core.messages import Message, ToolSpec
from app.core.output_schema import ResponseFormat
from app.core.reasoning import Reasoning
from app.core.tool_choice import ToolChoice
from app.core.usage import UsageReport


@dataclass(frozen=True, slots=True)
class ModelRequest:
    model: str  # the provider's own model name (what follows "provider:")
    messages: Sequence[Message]
    tools: Sequence[ToolSpec] = ()
    max_output_tokens: int | None = None
    temperature: float | None = None
    # The tokens the projection kept free for the answer (the policy's reserve): the answer's
    # length for providers that need one when max_output_tokens is unset (local, compat).
    answer_room: int | None = None
    # Indices in `messages` that end a prefix worth caching (the projection's
    # cache_breakpoints): Anthropic marks them with cache_control, others ignore them.
    cache_breakpoints: Sequence[int] = ()
    # Routes consecutive calls of one thread to the same prompt cache (OpenAI's
    # prompt_cache_key); None: send none.
    cache_key: str | None = None
    # Which tools the model may or must call on this turn (see app.core.tool_choice), and
    # whether it may call several at once.
    tool_choice: ToolChoice = "auto"
    parallel_tool_calls: bool = True
    # Think before answering (None: no reasoning); providers whose models cannot ignore it
    # (asks are refused before they get here: app.llm.catalog.can_reason).
    reasoning: Reasoning | None = None
    # The JSON Schema the answer follows (None: free text); each provider sends it its way.
    response_format: ResponseFormat | None = None


def prompt_cache_key(session_id: str) -> str:
    """The prompt cache key of a session's model calls: one per thread, so that consecutive
    asks (whose prompts share their prefix) reach the same cache."""
    return f"threadline-{session_id}"


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A piece of a streamed tool call; pieces with the same index belong to one call."""

    index: int
    id: str | None
    name: str | None
    arguments: str  # a fragment of the JSON arguments


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    """A piece of the readable text of a reasoning block, as the model thinks it; pieces with
    the same index (the provider's content block) are one block."""

    index: int
    text: str


@dataclass(frozen=True, slots=True)
class ReasoningBlock:
    """A reasoning block the provider closed: the content part to keep, byte for byte, with
    what the provider checks when it comes back ({"type": "thinking", "thinking", "signature"}
    or {"type": "redacted_thinking", "data"})."""

    index: int
    part: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Finish:
    reason: str  # stop | length | tool_calls | content_filter | ... as the provider says

    @property
    def neutral(self) -> FinishReason:
        """The reason in Threadline's words, whichever provider said it."""
        return _NEUTRAL_FINISH.get(self.reason, "other")


_NEUTRAL_FINISH: dict[str, FinishReason] = {
    # OpenAI Chat Completions (and compatible servers, llama.cpp)
    "stop": "stop",
    "length": "length",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "content_filter": "content_filter",
    # Anthropic Messages
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}


StreamEvent = TextDelta | ToolCallDelta | ReasoningDelta | ReasoningBlock | UsageReport | Finish


# What Postgres stores no text with: a lone surrogate, and the NUL character.
_UNSTORABLE_TEXT = re.compile("[\x00\ud800-\udfff]")


def storable(event: StreamEvent) -> StreamEvent:
    """`event` with any lone surrogate or NUL in its text replaced by U+FFFD. A provider's JSON
    may escape one (\\ud800, \\u0000), which decodes to a str Postgres cannot store: the run's
    events and its answer could never be written, and the run would never end. A reasoning
    block holding one is a bad response (ProviderError): it may not be changed."""
    if isinstance(event, TextDelta) and _UNSTORABLE_TEXT.search(event.text):
        return TextDelta(_UNSTORABLE_TEXT.sub("\ufffd", event.text))
    if isinstance(event, ReasoningBlock) and (why := unstorable(event.part)) is not None:
        # Kept byte for byte or not at all: the provider checks the block when it comes back,
        # so it cannot be mended as text is. Asked again, the model thinks anew.
        raise ProviderError(
            "bad_response",
            f"the model's reasoning block cannot be journaled byte for byte: {why}",
        )
    if isinstance(event, ReasoningDelta) and _UNSTORABLE_TEXT.search(event.text):
        # Shown only: the block itself (ReasoningBlock) is kept as signed.
        return ReasoningDelta(event.index, _UNSTORABLE_TEXT.sub("\ufffd", event.text))
    if isinstance(event, ToolCallDelta) and (
        _UNSTORABLE_TEXT.search(event.arguments) or _UNSTORABLE_TEXT.search(event.name or "")
    ):
        name = _UNSTORABLE_TEXT.sub("\ufffd", event.name) if event.name else event.name
        arguments = _UNSTORABLE_TEXT.sub("\ufffd", event.arguments)
        return ToolCallDelta(event.index, event.id, name, arguments)
    return event


ErrorKind = Literal[
    "rate_limited",
    "overloaded",
    "server",
    "timeout",
    "connection",
    "bad_response",  # the stream said something that is not the API's format (not JSON)
    "bad_request",
    "auth",
    "not_found",
    "unavailable",
]
# Transient: asking again may well get an answer. A garbled stream is a transport fault (a
# proxy, a cut connection), not something the request said.
RETRYABLE: frozenset[str] = frozenset(
    {"rate_limited", "overloaded", "server", "timeout", "connection", "bad_response"}
)


class ProviderError(Exception):
    """A failed model call, classified so the router knows whether to retry or fall back."""

    def __init__(self, kind: ErrorKind, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.status = status

    @property
    def retryable(self) -> bool:
        return self.kind in RETRYABLE

    def as_error(self) -> dict[str, str]:
        """The run error it ends a run with: {"code": "provider_<kind>", "message"}."""
        return {"code": f"provider_{self.kind}", "message": self.message}


def transport_failure(error: BaseException, timed_out: bool) -> ProviderError:
    """A timed-out or failed transport. `timed_out` is what the error's type says; what went
    wrong at the bottom of its causes says more when there is one: the SDKs' aiohttp
    transport raises every aiohttp connection error (refused, reset) as a connect timeout."""
    import aiohttp

    root = error
    while root.__cause__ is not None:
        root = root.__cause__
    if root is not error:
        if isinstance(root, TimeoutError):
            timed_out = True
        elif isinstance(root, OSError | aiohttp.ClientError):
            timed_out = False
    if timed_out:
        return ProviderError("timeout", f"request timed out: {root!r}")
    return ProviderError("connection", f"connection failed: {root!r}")


@dataclass(frozen=True, slots=True)
class Restart:
    """What was streamed before this is void: that attempt failed after its output began, and
    the model was asked again (the same request); its answer follows from the start. Only
    callers that asked for restarts get one (Router.stream)."""

    error: ProviderError  # why the earlier attempt was given up


RoutedEvent = StreamEvent | Restart  # what Router.stream yields


class Provider(Protocol):
    """One provider family (openai, anthropic, compat, local)."""

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        """Stream the model's answer; raise ProviderError for any failure."""
        ...


async def classified(
    events: AsyncIterator[StreamEvent],
    sdk_error: type[Exception],
    classify: Callable[[Any], ProviderError],
) -> AsyncIterator[StreamEvent]:
    """A provider's events, every failure turned into a ProviderError: the SDK's own errors by
    `classify`, transport failures inside a stream (which the SDKs pass through unwrapped) by
    their nature, and a streamed chunk the SDK could not parse as "bad_response"."""
    import json
    import ssl

    import anyio
    import httpx2

    try:
        async for event in events:
            yield event
    except sdk_error as error:
        raise classify(error) from error
    except (httpx2.RequestError, ssl.SSLError, anyio.EndOfStream) as error:
        raise transport_failure(error, isinstance(error, httpx2.TimeoutException)) from error
    except json.JSONDecodeError as error:
        # The SDKs parse each event's data with json.loads and let its error through.
        raise ProviderError(
            "bad_response", f"the provider streamed a chunk that is not JSON: {error}"
        ) from error
