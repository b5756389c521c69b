"""A fake LLM upstream: OpenAI Chat Completions and Anthropic Messages streaming over real HTTP.

The official SDKs bring their own HTTP client, so request-patching libraries cannot see their
traffic; this server answers them on 127.0.0.1 instead. Each test scripts the next responses:

    with FakeUpstream() as up:
        up.script(Text("Hel"), Text("lo"), Usage(12, 2, cached=4))
        up.script(Fail(429))
        ...  # point a client at up.openai_base_url or up.url
        assert up.requests[0].body["model"] == "gpt-test"

Scripts are consumed FIFO, one per request, by either API; with none queued the answer is a
short "ok". Any Authorization / x-api-key header is accepted.

A JsonAnswer streams a structured answer as text. A request's structured output format is
checked in each API's shape (OpenAI's response_format json_schema, Anthropic's
output_config.format) and refused with the API's 400 otherwise.

Anthropic extended thinking is streamed as the API streams it (Thinking, RedactedThinking), and
checked as the API checks it: the fake signs each block (its text, its place among the turn's
blocks and their number, and with interleaved thinking the tool_use blocks before it), and
refuses with Anthropic's 400 a request whose final assistant turn in a tool loop does not start
with its thinking, or sends it back altered, reordered, in part, or moved among the turn's
tool_use blocks;
a thinking budget under 1024 or not below max_tokens, and thinking with a forced tool_choice.

OpenAI's Responses API (POST /v1/responses) streams the same steps in its own events: Thinking
and RedactedThinking become reasoning items (a summary streamed as
response.reasoning_summary_text.delta pieces, or none), whose encrypted_content the fake seals
(the item's id, text, and place among the response's reasoning items). It refuses, with
OpenAI's 400, a request that sends a reasoning item back altered, or a tool loop (input ending
with function_call_output) whose latest turns' reasoning items are missing or reordered.
Chat Completions stream ReasoningContent steps as `reasoning_content` (or `reasoning`) deltas,
as DeepSeek, vLLM, llama.cpp and OpenRouter do, and refuse (as DeepSeek does) a request that
sends reasoning_content back.
A thought scripted after a tool call is streamed only with the interleaved-thinking beta header
(the model then thinks between its tool calls); without it, it is left out.
Documents are checked in each API's shape, refused with its 400: Anthropic `document` blocks
(a base64 application/pdf source whose bytes are a PDF, or a text/plain text source) and OpenAI
`file` parts (a filename and file_data, a base64 data URL of a PDF), in user messages only.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import socket
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

Json = dict[str, Any]


# --- Script steps ------------------------------------------------------------------------


@dataclass(frozen=True)
class Text:
    """One streamed text delta."""

    text: str


@dataclass(frozen=True)
class JsonAnswer:
    """A structured answer: `value` as JSON text, streamed as `fragments` text deltas."""

    value: Any
    fragments: int = 3


@dataclass(frozen=True)
class ToolCall:
    """A tool call, streamed as its header and then `fragments` pieces of the arguments.

    `id` None: the header carries no id (some OpenAI-compatible servers send none)."""

    id: str | None
    name: str
    arguments: str  # the JSON arguments as the model would write them
    fragments: int = 3


@dataclass(frozen=True)
class Thinking:
    """An Anthropic thinking block: `fragments` thinking_delta pieces, then its signature (one
    signature_delta), which the fake checks when the block comes back."""

    text: str
    fragments: int = 3


@dataclass(frozen=True)
class RedactedThinking:
    """An Anthropic redacted_thinking block: opaque data (the fake's encryption of `text`),
    whole in its content_block_start."""

    text: str = "reasoning the safety systems flagged"


@dataclass(frozen=True)
class ReasoningContent:
    """Readable reasoning an OpenAI-compatible server streams in chat-completion chunks:
    `fragments` deltas of `field` (reasoning_content: DeepSeek, vLLM, llama.cpp; reasoning:
    OpenRouter)."""

    text: str
    field: str = "reasoning_content"
    fragments: int = 3


@dataclass(frozen=True)
class Usage:
    """The usage the upstream reports (wherever the step stands in the script).

    `input` is the whole prompt, `cached` (read from the prompt cache) and `written` (written
    to it) included, as OpenAI counts it. Only Anthropic reports `written`.
    """

    input: int
    output: int
    cached: int = 0
    written: int = 0
    reasoning: int = 0  # of the output (OpenAI reports it)


@dataclass(frozen=True)
class Fail:
    """Answer with an HTTP error and the provider's JSON error body, before any output."""

    status: int
    kind: str | None = None  # rate_limit | overloaded | server | bad_request | auth | ...
    message: str = "scripted failure"


@dataclass(frozen=True)
class FailMidStream:
    """Fail after what came before: an error event/chunk, or (disconnect) a dropped connection."""

    kind: str = "overloaded"
    message: str = "Overloaded"
    disconnect: bool = False


@dataclass(frozen=True)
class Stall:
    """Send nothing for a while; leading stalls hold back the response headers too."""

    seconds: float


@dataclass(frozen=True)
class Hold:
    """Send nothing until the test sets `release` (or the fake stops); leading holds hold back
    the response headers too. A deliberately slow upstream, without guessing a duration."""

    release: threading.Event


@dataclass(frozen=True)
class Malformed:
    """A streamed chunk whose data is not JSON (a broken proxy, a garbled upstream)."""

    raw: str = '{"choices": [ garbled'


@dataclass(frozen=True)
class Chunk:
    """A streamed chunk of the test's making: `payload` as the data (JSON) of an OpenAI chunk,
    or of an Anthropic event named by its "type" (content_block_delta when it names none)."""

    payload: Any


@dataclass(frozen=True)
class Truncate:
    """End the body here, cleanly: no finish reason, no end marker (a proxy that cut it)."""


Step = (
    Text
    | ToolCall
    | Thinking
    | RedactedThinking
    | ReasoningContent
    | Usage
    | Fail
    | FailMidStream
    | Stall
    | Hold
    | Malformed
    | Chunk
    | Truncate
)


@dataclass(frozen=True)
class Script:
    steps: tuple[Step, ...]
    token_delay: float = 0.0
    stop_reason: str | None = None  # default: tool calls or a normal stop, in each API's words
    report_usage: bool = True  # False: like servers that ignore stream_options.include_usage


@dataclass(frozen=True)
class ReceivedRequest:
    path: str
    body: Json
    headers: dict[str, str]


DEFAULT_SCRIPT = Script((Text("ok"),))
Responder = Callable[[ReceivedRequest], Script]

# Each neutral failure kind as (default status, OpenAI error type, Anthropic error type).
_KINDS: dict[str, tuple[int, str, str]] = {
    "bad_request": (400, "invalid_request_error", "invalid_request_error"),
    "auth": (401, "invalid_request_error", "authentication_error"),
    "permission": (403, "invalid_request_error", "permission_error"),
    "not_found": (404, "invalid_request_error", "not_found_error"),
    "too_large": (413, "invalid_request_error", "request_too_large"),
    "rate_limit": (429, "requests", "rate_limit_error"),
    "quota": (429, "insufficient_quota", "rate_limit_error"),
    "server": (500, "server_error", "api_error"),
    "overloaded": (529, "overloaded_error", "overloaded_error"),
}
_OPENAI_CODES = {
    "rate_limit": "rate_limit_exceeded",
    "quota": "insufficient_quota",
    "auth": "invalid_api_key",
}


def _kind_for_status(status: int) -> str:
    for kind, (default_status, _, _) in _KINDS.items():
        if default_status == status:
            return kind
    return "server" if status >= 500 else "bad_request"


class _Disconnect(Exception):
    """Raised inside a streaming body so the server drops the connection mid-response."""


# --- The server --------------------------------------------------------------------------


class FakeUpstream:
    """A scriptable OpenAI + Anthropic streaming server on 127.0.0.1, in a background thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)  # notified as each request arrives
        self._scripts: deque[Script] = deque()
        self._responder: Responder | None = None
        self._requests: list[ReceivedRequest] = []
        self._stopping = threading.Event()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._port = 0
        self._props: Json | None = None

    # -- lifecycle

    def start(self) -> FakeUpstream:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self._port = sock.getsockname()[1]
        config = uvicorn.Config(
            self._app(), lifespan="off", log_level="critical", timeout_graceful_shutdown=2
        )
        server = uvicorn.Server(config)
        thread = threading.Thread(
            target=server.run, kwargs={"sockets": [sock]}, daemon=True, name="fake-upstream"
        )
        thread.start()
        deadline = time.monotonic() + 10
        while not server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError("the fake upstream did not start")
            time.sleep(0.01)
        self._server, self._thread = server, thread
        return self

    def stop(self) -> None:
        self._stopping.set()  # ends stalls, so shutdown need not wait them out
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._server = self._thread = None

    def __enter__(self) -> FakeUpstream:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- what tests use

    @property
    def url(self) -> str:
        """The base URL (Anthropic SDK base_url; the OpenAI SDK wants openai_base_url)."""
        return f"http://127.0.0.1:{self._port}"

    @property
    def openai_base_url(self) -> str:
        return f"{self.url}/v1"

    def script(
        self,
        *steps: Step | JsonAnswer,
        token_delay: float = 0.0,
        stop_reason: str | None = None,
        report_usage: bool = True,
    ) -> None:
        """Queue the answer to one future request (FIFO); a JsonAnswer is its text deltas."""
        streamed: list[Step] = []
        for step in steps:
            if isinstance(step, JsonAnswer):
                text = json.dumps(step.value, ensure_ascii=False)
                streamed.extend(Text(piece) for piece in _fragments(text, step.fragments))
            else:
                streamed.append(step)
        with self._lock:
            self._scripts.append(Script(tuple(streamed), token_delay, stop_reason, report_usage))

    def serve_props(self, props: Json | None) -> None:
        """Answer GET <prefix>/props with `props` (as llama.cpp's server does), None: 404."""
        with self._lock:
            self._props = props

    def respond_with(self, responder: Responder | None) -> None:
        """Answer requests for which no script is queued by calling `responder` with the
        request (for long conversations whose turns depend on what the service sends)."""
        with self._lock:
            self._responder = responder

    @property
    def requests(self) -> list[ReceivedRequest]:
        with self._lock:
            return list(self._requests)

    @property
    def pending(self) -> int:
        """Scripts not yet consumed."""
        with self._lock:
            return len(self._scripts)

    async def requests_arrived(self, count: int, within: float = 60.0) -> None:
        """Until `count` requests have arrived since clear(): a condition, not a duration (the
        model call a test holds with Hold has begun once its request is here)."""

        def wait() -> bool:
            with self._arrived:
                return self._arrived.wait_for(lambda: len(self._requests) >= count, within)

        if not await asyncio.to_thread(wait):
            raise TimeoutError(f"{len(self._requests)} of {count} requests within {within} s")

    def clear(self) -> None:
        with self._lock:
            self._scripts.clear()
            self._requests.clear()
            self._responder = None
            self._props = None

    # -- internals

    def _app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/{prefix:path}/chat/completions", self._openai, methods=["POST"]),
                Route("/{prefix:path}/messages", self._anthropic, methods=["POST"]),
                Route("/{prefix:path}/responses", self._responses, methods=["POST"]),
                Route("/{prefix:path}/props", self._server_props, methods=["GET"]),
            ]
        )

    async def _server_props(self, request: Request) -> Response:
        with self._lock:
            props = self._props
        if props is None:
            return JSONResponse({"error": "not found"}, status_code=404)
        return JSONResponse(props)

    async def _receive(self, request: Request) -> tuple[Json, Script]:
        body = await request.json()
        received = ReceivedRequest(request.url.path, body, dict(request.headers.items()))
        with self._lock:
            self._requests.append(received)
            self._arrived.notify_all()
            if self._scripts:
                script = self._scripts.popleft()
            elif self._responder is not None:
                script = self._responder(received)
            else:
                script = DEFAULT_SCRIPT
        return body, script

    async def _sleep(self, seconds: float) -> None:
        # In short steps, so that stop() need not wait out a long stall.
        deadline = time.monotonic() + seconds
        remaining = seconds
        while remaining > 0 and not self._stopping.is_set():
            await asyncio.sleep(min(0.02, remaining))
            remaining = deadline - time.monotonic()

    async def _hold(self, release: threading.Event) -> None:
        # Waited for in a thread (the test sets it from its own), in steps so stop() ends it.
        while not self._stopping.is_set():
            if await asyncio.to_thread(release.wait, 0.1):
                return

    async def _lead_in(self, script: Script) -> tuple[Fail | None, Sequence[Step]]:
        """Leading stalls and holds (before headers) and an up-front failure; the rest is
        streamed."""
        steps = list(script.steps)
        while steps and isinstance(first := steps[0], Stall | Hold):
            if isinstance(first, Hold):
                await self._hold(first.release)
            else:
                await self._sleep(first.seconds)
            del steps[0]
        if steps and isinstance(steps[0], Fail):
            return steps[0], ()
        return None, steps

    async def _openai(self, request: Request) -> Response:
        body, script = await self._receive(request)
        if not body.get("stream"):
            return _openai_error(400, "bad_request", "the fake upstream only streams")
        refused = (
            reasoning_content_problem(body)
            or openai_file_problem(body)
            or openai_format_problem(body)
        )
        if refused is not None:
            return _openai_error(400, "bad_request", refused)
        fail, steps = await self._lead_in(script)
        if fail is not None:
            return _openai_error(fail.status, fail.kind, fail.message)
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        chunks = self._openai_chunks(str(body.get("model")), script, steps, include_usage)
        return StreamingResponse(chunks, media_type="text/event-stream")

    async def _openai_chunks(
        self, model: str, script: Script, steps: Sequence[Step], include_usage: bool
    ) -> AsyncIterator[str]:
        base: Json = {
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model,
            "system_fingerprint": "fp_fake",
        }
        if include_usage:
            base["usage"] = None

        def chunk(delta: Json, finish: str | None = None) -> str:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            return _data({**base, "choices": [choice]})

        yield chunk({"role": "assistant", "content": ""})
        calls = 0
        for step in steps:
            if isinstance(step, Text):
                await self._sleep(script.token_delay)
                yield chunk({"content": step.text})
            elif isinstance(step, ReasoningContent):
                for piece in _fragments(step.text, step.fragments):
                    await self._sleep(script.token_delay)
                    yield chunk({step.field: piece})
            elif isinstance(step, ToolCall):
                header: Json = {
                    "index": calls,
                    "type": "function",
                    "function": {"name": step.name, "arguments": ""},
                }
                if step.id is not None:
                    header["id"] = step.id
                yield chunk({"tool_calls": [header]})
                for piece in _fragments(step.arguments, step.fragments):
                    await self._sleep(script.token_delay)
                    yield chunk(
                        {"tool_calls": [{"index": calls, "function": {"arguments": piece}}]}
                    )
                calls += 1
            elif isinstance(step, Stall):
                await self._sleep(step.seconds)
            elif isinstance(step, Hold):
                await self._hold(step.release)
            elif isinstance(step, FailMidStream | Fail):
                if isinstance(step, FailMidStream) and step.disconnect:
                    raise _Disconnect()
                kind = step.kind or "server"
                yield _data({"error": _openai_error_body(kind, step.message)})
                return
            elif isinstance(step, Malformed):
                yield f"data: {step.raw}\n\n"
            elif isinstance(step, Chunk):
                yield f"data: {json.dumps(step.payload)}\n\n"
            elif isinstance(step, Truncate):
                return
        finish = script.stop_reason or ("tool_calls" if calls else "stop")
        yield chunk({}, finish)
        if include_usage and script.report_usage:
            usage = _usage_of(steps)
            yield _data(
                {
                    **base,
                    "choices": [],
                    "usage": {
                        "prompt_tokens": usage.input,
                        "completion_tokens": usage.output,
                        "total_tokens": usage.input + usage.output,
                        "prompt_tokens_details": {
                            "cached_tokens": usage.cached,
                            "audio_tokens": 0,
                        },
                        "completion_tokens_details": {
                            "reasoning_tokens": usage.reasoning,
                            "audio_tokens": 0,
                        },
                    },
                }
            )
        yield "data: [DONE]\n\n"

    async def _anthropic(self, request: Request) -> Response:
        body, script = await self._receive(request)
        if not body.get("stream"):
            return _anthropic_error(400, "bad_request", "the fake upstream only streams")
        refused = (
            thinking_problem(body)
            or anthropic_document_problem(body)
            or anthropic_format_problem(body)
        )
        if refused is not None:
            return _anthropic_error(400, "bad_request", refused)
        fail, steps = await self._lead_in(script)
        if fail is not None:
            return _anthropic_error(fail.status, fail.kind, fail.message)
        if INTERLEAVED_THINKING_BETA not in request.headers.get("anthropic-beta", ""):
            # Without interleaved thinking the model thinks before its turn only: a scripted
            # thought after a tool call is not streamed.
            steps = _before_tool_calls_only(steps)
        events = self._anthropic_events(str(body.get("model")), script, steps)
        return StreamingResponse(events, media_type="text/event-stream")

    async def _anthropic_events(
        self, model: str, script: Script, steps: Sequence[Step]
    ) -> AsyncIterator[str]:
        usage = _usage_of(steps)
        message: Json = {
            "id": "msg_fake",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                # Anthropic counts cache reads and writes apart; Usage.input is the total.
                "input_tokens": usage.input - usage.cached - usage.written,
                "output_tokens": 1,
                "cache_read_input_tokens": usage.cached,
                "cache_creation_input_tokens": usage.written,
            },
        }
        yield _event("message_start", {"type": "message_start", "message": message})
        yield _event("ping", {"type": "ping"})
        index = -1
        open_text = False
        used_tools = False
        blocks = sum(1 for s in steps if isinstance(s, Thinking | RedactedThinking))
        place = 0  # of the reasoning blocks
        calls = 0  # tool_use blocks so far: a thought after some is sealed with how many
        for step in steps:
            if isinstance(step, Thinking | RedactedThinking):
                if open_text:
                    yield _event("content_block_stop", _block_stop(index))
                    open_text = False
                index += 1
                thought = self._thinking_events(script, step, index, place, blocks, calls)
                for event in thought:
                    if event is None:
                        await self._sleep(script.token_delay)
                    else:
                        yield event
                place += 1
            elif isinstance(step, Text):
                if not open_text:
                    index += 1
                    open_text = True
                    block: Json = {"type": "text", "text": ""}
                    yield _event("content_block_start", _block_start(index, block))
                await self._sleep(script.token_delay)
                delta = {"type": "text_delta", "text": step.text}
                yield _event("content_block_delta", _block_delta(index, delta))
            elif isinstance(step, ToolCall):
                if open_text:
                    yield _event("content_block_stop", _block_stop(index))
                    open_text = False
                index += 1
                used_tools = True
                calls += 1
                block = {"type": "tool_use", "id": step.id, "name": step.name, "input": {}}
                yield _event("content_block_start", _block_start(index, block))
                for piece in _fragments(step.arguments, step.fragments):
                    await self._sleep(script.token_delay)
                    delta = {"type": "input_json_delta", "partial_json": piece}
                    yield _event("content_block_delta", _block_delta(index, delta))
                yield _event("content_block_stop", _block_stop(index))
            elif isinstance(step, Stall):
                await self._sleep(step.seconds)
            elif isinstance(step, Hold):
                await self._hold(step.release)
            elif isinstance(step, FailMidStream | Fail):
                if isinstance(step, FailMidStream) and step.disconnect:
                    raise _Disconnect()
                yield _event("error", _anthropic_error_body(step.kind or "server", step.message))
                return
            elif isinstance(step, Malformed):
                yield f"event: content_block_delta\ndata: {step.raw}\n\n"
            elif isinstance(step, Chunk):
                payload = step.payload
                named = payload.get("type") if isinstance(payload, dict) else None
                plain = isinstance(named, str) and named.replace("_", "").isalnum()
                name = named if plain else "content_block_delta"
                yield f"event: {name}\ndata: {json.dumps(payload)}\n\n"
            elif isinstance(step, Truncate):
                return
        if open_text:
            yield _event("content_block_stop", _block_stop(index))
        stop = script.stop_reason or ("tool_use" if used_tools else "end_turn")
        yield _event(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop, "stop_sequence": None},
                "usage": {"output_tokens": usage.output},
            },
        )
        yield _event("message_stop", {"type": "message_stop"})

    def _thinking_events(
        self,
        script: Script,
        step: Thinking | RedactedThinking,
        index: int,
        place: int,
        of: int,
        after: int,
    ) -> Iterator[str | None]:
        """A reasoning block's events (None: a pause of the script's token delay); `after`:
        the tool_use blocks streamed before it (interleaved thinking)."""
        if isinstance(step, RedactedThinking):
            data = redacted_data(step.text, place, of, after)
            block: Json = {"type": "redacted_thinking", "data": data}
            yield _event("content_block_start", _block_start(index, block))
        else:
            block = {"type": "thinking", "thinking": "", "signature": ""}
            yield _event("content_block_start", _block_start(index, block))
            for piece in _fragments(step.text, step.fragments):
                yield None
                delta = {"type": "thinking_delta", "thinking": piece}
                yield _event("content_block_delta", _block_delta(index, delta))
            delta = {"type": "signature_delta", "signature": signature(step.text, place, of, after)}
            yield _event("content_block_delta", _block_delta(index, delta))
        yield _event("content_block_stop", _block_stop(index))

    async def _responses(self, request: Request) -> Response:
        body, script = await self._receive(request)
        if not body.get("stream"):
            return _openai_error(400, "bad_request", "the fake upstream only streams")
        refused = responses_problem(body) or responses_format_problem(body)
        if refused is not None:
            return _openai_error(400, "bad_request", refused)
        fail, steps = await self._lead_in(script)
        if fail is not None:
            return _openai_error(fail.status, fail.kind, fail.message)
        encrypted = "reasoning.encrypted_content" in (body.get("include") or [])
        events = self._responses_events(str(body.get("model")), script, steps, encrypted)
        return StreamingResponse(events, media_type="text/event-stream")

    async def _responses_events(
        self, model: str, script: Script, steps: Sequence[Step], encrypted: bool
    ) -> AsyncIterator[str]:
        sequence = 0
        output: list[Json] = []
        response: Json = {
            "id": "resp_fake",
            "object": "response",
            "created_at": int(time.time()),
            "model": model,
            "status": "in_progress",
            "output": output,
            "usage": None,
        }

        def event(payload: Json) -> str:
            nonlocal sequence
            sequence += 1
            return _event(str(payload["type"]), {**payload, "sequence_number": sequence - 1})

        yield event({"type": "response.created", "response": {**response, "output": []}})
        yield event({"type": "response.in_progress", "response": {**response, "output": []}})
        reasonings = sum(1 for s in steps if isinstance(s, Thinking | RedactedThinking))
        place = 0
        text: Json | None = None  # the open output message item

        def close_text() -> Iterator[str]:
            nonlocal text
            if text is None:
                return
            at, said = len(output) - 1, text["content"][0]
            yield event(
                {
                    "type": "response.output_text.done",
                    "item_id": text["id"],
                    "output_index": at,
                    "content_index": 0,
                    "text": said["text"],
                }
            )
            yield event(
                {
                    "type": "response.content_part.done",
                    "item_id": text["id"],
                    "output_index": at,
                    "content_index": 0,
                    "part": said,
                }
            )
            text["status"] = "completed"
            yield event({"type": "response.output_item.done", "output_index": at, "item": text})
            text = None

        calls = 0
        for step in steps:
            if not isinstance(step, Text | Stall | Hold):
                for closing in close_text():
                    yield closing
            at = len(output)
            if isinstance(step, Thinking | RedactedThinking):
                item_id = f"rs_fake{at}"
                said = step.text if isinstance(step, Thinking) else ""
                item: Json = {"id": item_id, "type": "reasoning", "summary": []}
                yield event(
                    {"type": "response.output_item.added", "output_index": at, "item": item}
                )
                output.append(item)
                if said:
                    where = {"item_id": item_id, "output_index": at, "summary_index": 0}
                    empty = {"type": "summary_text", "text": ""}
                    yield event(
                        {"type": "response.reasoning_summary_part.added", **where, "part": empty}
                    )
                    for piece in _fragments(
                        said, step.fragments if isinstance(step, Thinking) else 1
                    ):
                        await self._sleep(script.token_delay)
                        yield event(
                            {
                                "type": "response.reasoning_summary_text.delta",
                                **where,
                                "delta": piece,
                            }
                        )
                    yield event(
                        {"type": "response.reasoning_summary_text.done", **where, "text": said}
                    )
                    done: Json = {"type": "summary_text", "text": said}
                    yield event(
                        {"type": "response.reasoning_summary_part.done", **where, "part": done}
                    )
                    item["summary"] = [done]
                if encrypted:
                    item["encrypted_content"] = sealed_reasoning(
                        item_id, step.text, place, reasonings
                    )
                yield event({"type": "response.output_item.done", "output_index": at, "item": item})
                place += 1
            elif isinstance(step, Text):
                if text is None:
                    text = {
                        "id": f"msg_fake{at}",
                        "type": "message",
                        "role": "assistant",
                        "status": "in_progress",
                        "content": [],
                    }
                    yield event(
                        {"type": "response.output_item.added", "output_index": at, "item": text}
                    )
                    output.append(text)
                    part = {"type": "output_text", "text": "", "annotations": []}
                    yield event(
                        {
                            "type": "response.content_part.added",
                            "item_id": text["id"],
                            "output_index": at,
                            "content_index": 0,
                            "part": part,
                        }
                    )
                    text["content"] = [part]
                await self._sleep(script.token_delay)
                text["content"][0]["text"] += step.text
                yield event(
                    {
                        "type": "response.output_text.delta",
                        "item_id": text["id"],
                        "output_index": len(output) - 1,
                        "content_index": 0,
                        "delta": step.text,
                        "logprobs": [],
                    }
                )
            elif isinstance(step, ToolCall):
                call: Json = {
                    "id": f"fc_fake{at}",
                    "type": "function_call",
                    "status": "in_progress",
                    "call_id": step.id or f"call_fake{at}",
                    "name": step.name,
                    "arguments": "",
                }
                yield event(
                    {"type": "response.output_item.added", "output_index": at, "item": call}
                )
                output.append(call)
                where = {"item_id": call["id"], "output_index": at}
                for piece in _fragments(step.arguments, step.fragments):
                    await self._sleep(script.token_delay)
                    yield event(
                        {"type": "response.function_call_arguments.delta", **where, "delta": piece}
                    )
                call["arguments"] = step.arguments
                call["status"] = "completed"
                yield event(
                    {
                        "type": "response.function_call_arguments.done",
                        **where,
                        "arguments": step.arguments,
                    }
                )
                yield event({"type": "response.output_item.done", "output_index": at, "item": call})
                calls += 1
            elif isinstance(step, Stall):
                await self._sleep(step.seconds)
            elif isinstance(step, Hold):
                await self._hold(step.release)
            elif isinstance(step, FailMidStream | Fail):
                if isinstance(step, FailMidStream) and step.disconnect:
                    raise _Disconnect()
                kind = step.kind or "server"
                error = _openai_error_body(kind, step.message)
                yield event(
                    {
                        "type": "error",
                        "code": error["code"] or error["type"],
                        "message": step.message,
                        "param": None,
                    }
                )
                return
            elif isinstance(step, Malformed):
                yield f"event: response.output_text.delta\ndata: {step.raw}\n\n"
            elif isinstance(step, Chunk):
                yield event(dict(step.payload))
            elif isinstance(step, Truncate):
                return
        for closing in close_text():
            yield closing
        usage = _usage_of(steps)
        response["usage"] = {
            "input_tokens": usage.input,
            "input_tokens_details": {"cached_tokens": usage.cached},
            "output_tokens": usage.output,
            "output_tokens_details": {"reasoning_tokens": usage.reasoning},
            "total_tokens": usage.input + usage.output,
        }
        if script.stop_reason in ("length", "max_output_tokens"):
            response |= {
                "status": "incomplete",
                "incomplete_details": {"reason": "max_output_tokens"},
            }
            yield event({"type": "response.incomplete", "response": response})
        else:
            response["status"] = "completed"
            yield event({"type": "response.completed", "response": response})


# --- OpenAI reasoning: the fake's encrypted reasoning items and the APIs' checks -----------


def sealed_reasoning(item_id: str, text: str, place: int, of: int) -> str:
    """A reasoning item's encrypted_content: its id, text and place among the response's `of`
    reasoning items, sealed (opaque base64, like OpenAI's)."""
    mac = _mac(f"{item_id}\x00{text}", place, of)
    return base64.b64encode(json.dumps([place, of, item_id, text, mac]).encode()).decode()


def _unsealed_reasoning(item: Json) -> tuple[int, int] | None:
    """(place, of) of a reasoning item sent back, None if it is not the fake's, unaltered."""
    try:
        place, of, item_id, text, mac = json.loads(base64.b64decode(item["encrypted_content"]))
        expected = _mac(f"{item_id}\x00{text}", int(place), int(of))
        if item_id == item.get("id") and hmac.compare_digest(str(mac), expected):
            return int(place), int(of)
    except (KeyError, ValueError, TypeError, UnicodeDecodeError):
        pass
    return None


def responses_problem(body: Json) -> str | None:
    """What OpenAI's Responses API would refuse about a request's reasoning items (its
    message), None if nothing: one that cannot be decrypted (altered, or not sent with its
    encrypted content under store: false); in a tool loop (the input ends with tool outputs),
    a turn since the last user message whose reasoning is missing or out of order."""
    items = [i for i in body.get("input") or [] if isinstance(i, dict)]
    for item in items:
        if item.get("type") == "reasoning" and _unsealed_reasoning(item) is None:
            return f"The encrypted content for item {item.get('id')} could not be verified."
    if not items or items[-1].get("type") != "function_call_output":
        return None
    users = [at for at, i in enumerate(items) if i.get("role") == "user"]
    turns: list[list[Json]] = [[]]
    for item in items[users[-1] + 1 if users else 0 :]:
        if item.get("type") == "function_call_output":
            if turns[-1]:
                turns.append([])
        else:
            turns[-1].append(item)
    for turn in turns:
        calls = [i for i in turn if i.get("type") == "function_call"]
        reasoning = [i for i in turn if i.get("type") == "reasoning"]
        if body.get("reasoning") and calls and (not turn or turn[0].get("type") != "reasoning"):
            return (
                f"Item '{calls[0].get('call_id')}' of type 'function_call' was provided "
                "without its required 'reasoning' item."
            )
        sealed = [_unsealed_reasoning(i) for i in reasoning]
        of = sealed[0][1] if sealed and sealed[0] else 0
        if sealed and sealed != [(place, of) for place in range(of)]:
            return "Reasoning items of a turn were provided incomplete or out of order."
    return None


def reasoning_content_problem(body: Json) -> str | None:
    """What DeepSeek's API refuses: an assistant message sent back with its reasoning_content."""
    for at, message in enumerate(body.get("messages") or []):
        if isinstance(message, dict) and ("reasoning_content" in message or "reasoning" in message):
            return (
                f"messages[{at}]: the reasoning_content of an earlier turn must not be sent "
                "back; remove it from the request"
            )
    return None


# --- Anthropic extended thinking: the fake's signatures and the API's checks ---------------

_SECRET = b"threadline-fake-upstream"
MIN_THINKING_BUDGET = 1024


def _mac(text: str, place: int, of: int, after: int = 0) -> str:
    # surrogatepass: a model's text may hold a lone surrogate (JSON escapes one), signed too.
    where = f"{place}/{of}/{after}" if after else f"{place}/{of}"
    message = f"{where}\x00{text}".encode("utf-8", "surrogatepass")
    return hmac.new(_SECRET, message, hashlib.sha256).hexdigest()


def signature(text: str, place: int, of: int, after: int = 0) -> str:
    """A thinking block's signature: its place among the turn's `of` reasoning blocks, and
    (interleaved thinking) the `after` tool_use blocks the model wrote before it, signed with
    its text (opaque base64, like Anthropic's)."""
    sealed = f"{place}.{of}.{_mac(text, place, of, after)}" + (f".{after}" if after else "")
    return base64.b64encode(sealed.encode()).decode()


def redacted_data(text: str, place: int, of: int, after: int = 0) -> str:
    """A redacted block's data: its text and place, sealed (opaque base64)."""
    sealed = [place, of, text, _mac(text, place, of, after)] + ([after] if after else [])
    return base64.b64encode(json.dumps(sealed).encode()).decode()


def _opened(block: Json) -> tuple[int, int, int] | None:
    """(place, of, after) of a reasoning block sent back, None if it is not the fake's,
    unaltered."""
    try:
        sealed: list[Any]
        if block.get("type") == "thinking":
            sealed = base64.b64decode(block["signature"]).decode().split(".")
            sealed.insert(2, block["thinking"])
        else:
            sealed = json.loads(base64.b64decode(block["data"]))
        place, of, text, mac = int(sealed[0]), int(sealed[1]), sealed[2], sealed[3]
        after = int(sealed[4]) if len(sealed) > 4 else 0
        if isinstance(text, str) and hmac.compare_digest(str(mac), _mac(text, place, of, after)):
            return place, of, after
    except (KeyError, ValueError, TypeError, UnicodeDecodeError):
        pass
    return None


def _unsealed(block: Json) -> tuple[int, int] | None:
    """(place, of) of a reasoning block sent back, None if it is not the fake's, unaltered."""
    opened = _opened(block)
    return None if opened is None else opened[:2]


def thinking_problem(body: Json) -> str | None:
    """What Anthropic's API would refuse about a request's extended thinking (its message),
    None if nothing."""
    thinking = body.get("thinking")
    enabled = isinstance(thinking, dict) and thinking.get("type") == "enabled"
    if isinstance(thinking, dict) and enabled:
        budget = thinking.get("budget_tokens")
        if not isinstance(budget, int) or budget < MIN_THINKING_BUDGET:
            return f"thinking.enabled.budget_tokens: Input should be >= {MIN_THINKING_BUDGET}"
        if not isinstance(body.get("max_tokens"), int) or body["max_tokens"] <= budget:
            return "`max_tokens` must be greater than `thinking.budget_tokens`"
        if (body.get("tool_choice") or {}).get("type") in ("any", "tool"):
            return "Thinking may not be enabled when tool_choice forces tool use."
    messages = body.get("messages") or []
    for at, message in enumerate(messages):
        content = message.get("content")
        calls = 0  # tool_use blocks before this one: a thought must come back where it was
        for place, block in enumerate(content if isinstance(content, list) else []):
            kind = block.get("type") if isinstance(block, dict) else None
            calls += kind == "tool_use"
            if kind not in ("thinking", "redacted_thinking"):
                continue
            opened = _opened(block)
            if opened is None or opened[2] != calls:
                return f"messages.{at}.content.{place}: Invalid `signature` in `{kind}` block"
    if enabled:
        return _tool_loop_problem(messages)
    return None


def _tool_loop_problem(messages: list[Json]) -> str | None:
    """In a tool loop (the last message returns tool results), the final assistant message
    must start with its thinking, every block of it, in order."""
    if len(messages) < 2 or not _has_block(messages[-1], "tool_result"):
        return None
    at = len(messages) - 2
    content = messages[at].get("content")
    blocks = content if isinstance(content, list) else []
    reasoning = [b for b in blocks if b.get("type") in ("thinking", "redacted_thinking")]
    if not blocks or blocks[0].get("type") not in ("thinking", "redacted_thinking"):
        found = blocks[0].get("type") if blocks else "nothing"
        return (
            f"messages.{at}.content.0.type: Expected `thinking` or `redacted_thinking`, but "
            f"found `{found}`. When `thinking` is enabled, a final `assistant` message must "
            "start with a thinking block (preceeding the lastmost set of `tool_use` and "
            "`tool_result` blocks). We recommend you include thinking blocks from previous "
            "turns. To avoid this requirement, disable `thinking`."
        )
    sealed = [_unsealed(b) for b in reasoning]
    of = sealed[0][1] if sealed[0] else 0
    if sealed != [(place, of) for place in range(of)]:
        return f"messages.{at}.content: Invalid `signature` in `thinking` block"
    return None


def _pdf_bytes(encoded: Any) -> bool:
    try:
        raw = base64.b64decode(str(encoded), validate=True)
    except ValueError:
        return False
    return raw.startswith(b"%PDF-")


def _parts(body: Json, part_type: str) -> Iterator[tuple[int, int, Json, Json]]:
    """(message index, part index, message, part) of each content part of this type."""
    for at, message in enumerate(body.get("messages") or []):
        content = message.get("content")
        for place, part in enumerate(content if isinstance(content, list) else []):
            if isinstance(part, dict) and part.get("type") == part_type:
                yield at, place, message, part


def anthropic_document_problem(body: Json) -> str | None:
    """What Anthropic's API would refuse about a request's document blocks, None if nothing."""
    for at, place, message, block in _parts(body, "document"):
        where = f"messages.{at}.content.{place}"
        if message.get("role") != "user":
            return f"{where}: document blocks are only allowed in user messages"
        source = block.get("source") or {}
        kind, media_type = source.get("type"), source.get("media_type")
        if kind == "base64":
            if media_type != "application/pdf":
                field = f"{where}.document.source.base64.media_type"
                return f"{field}: Input should be 'application/pdf'"
            if not _pdf_bytes(source.get("data")):
                return f"{where}.document.source.base64.data: The PDF specified was not valid."
        elif kind == "text":
            if media_type != "text/plain":
                return f"{where}.document.source.text.media_type: Input should be 'text/plain'"
            if not isinstance(source.get("data"), str):
                return f"{where}.document.source.text.data: Input should be a valid string"
        else:
            return (
                f"{where}.document.source: Input tag {kind!r} found using 'type' does not "
                "match any of the expected tags: 'base64', 'content', 'text', 'url'"
            )
        title = block.get("title")
        if title is not None and not isinstance(title, str):
            return f"{where}.document.title: Input should be a valid string"
    return None


def openai_file_problem(body: Json) -> str | None:
    """What OpenAI's Chat Completions would refuse about a request's file parts."""
    for at, place, message, part in _parts(body, "file"):
        where = f"messages[{at}].content[{place}]"
        if message.get("role") != "user":
            return f"Invalid '{where}': file content parts are only allowed in user messages."
        file = part.get("file") or {}
        if not isinstance(file.get("filename"), str) or not file["filename"]:
            return f"Missing required parameter: '{where}.file.filename'."
        data = str(file.get("file_data", ""))
        prefix = "data:application/pdf;base64,"
        if not data.startswith(prefix) or not _pdf_bytes(data.removeprefix(prefix)):
            return (
                f"Invalid file data: '{where}.file.file_data'. Expected a base64-encoded "
                "data URL with an application/pdf MIME type (e.g. "
                "'data:application/pdf;base64,...')."
            )
    return None


def _has_block(message: Json, kind: str) -> bool:
    content = message.get("content")
    return isinstance(content, list) and any(
        isinstance(b, dict) and b.get("type") == kind for b in content
    )


# --- Structured outputs: the request shapes each API takes --------------------------------


def openai_format_problem(body: Json) -> str | None:
    """What OpenAI's Chat Completions would refuse about a request's response_format."""
    if "response_format" not in body:
        return None
    given = body["response_format"]
    kind = given.get("type") if isinstance(given, dict) else None
    if kind in ("text", "json_object") and set(given) == {"type"}:
        return None
    if kind != "json_schema":
        return "Invalid value for 'response_format.type': expected text, json_object, json_schema"
    spec = given.get("json_schema")
    if set(given) != {"type", "json_schema"} or not isinstance(spec, dict):
        return "Missing required parameter: 'response_format.json_schema'."
    unknown = set(spec) - {"name", "description", "schema", "strict"}
    if unknown:
        return f"Unrecognized request argument: 'response_format.json_schema.{unknown.pop()}'"
    name = spec.get("name")
    if not isinstance(name, str) or not name or len(name) > 64:
        return "Invalid 'response_format.json_schema.name': a name of 1 to 64 characters."
    if not isinstance(spec.get("schema"), dict):
        return "Invalid type for 'response_format.json_schema.schema': expected an object."
    if spec.get("strict") is True:
        return _strict_problem(spec["schema"], "response_format.json_schema.schema")
    return None


def responses_format_problem(body: Json) -> str | None:
    """What OpenAI's Responses API would refuse about a request's text.format."""
    text = body.get("text")
    if text is None:
        return None
    given = text.get("format") if isinstance(text, dict) else None
    if not isinstance(given, dict) or given.get("type") not in (
        "text",
        "json_object",
        "json_schema",
    ):
        return "Invalid value for 'text.format.type'"
    if given["type"] != "json_schema":
        return None
    unknown = set(given) - {"type", "name", "description", "schema", "strict"}
    if unknown:
        return f"Unknown parameter: 'text.format.{unknown.pop()}'."
    if not isinstance(given.get("name"), str) or not isinstance(given.get("schema"), dict):
        return "Missing required parameter: 'text.format.name' or 'text.format.schema'."
    if given.get("strict") is True:
        return _strict_problem(given["schema"], "text.format.schema")
    return None


def anthropic_format_problem(body: Json) -> str | None:
    """What Anthropic's Messages API would refuse about a request's output_config.format."""
    if "output_format" in body:
        return "output_format: Extra inputs are not permitted (use output_config.format)"
    config = body.get("output_config")
    if config is None:
        return None
    if not isinstance(config, dict) or set(config) - {"format", "effort"}:
        return "output_config: Extra inputs are not permitted"
    given = config.get("format")
    if given is None:
        return None
    if not isinstance(given, dict) or given.get("type") != "json_schema":
        return "output_config.format.type: Input should be 'json_schema'"
    if set(given) != {"type", "schema"} or not isinstance(given["schema"], dict):
        return "output_config.format: a schema (an object) and nothing else"
    return _strict_problem(given["schema"], "output_config.format.schema")


def _strict_problem(schema: Any, where: str) -> str | None:
    """Both APIs: every object of a strict schema sets additionalProperties false."""
    todo: list[tuple[str, Any]] = [(where, schema)]
    while todo:
        at, node = todo.pop()
        if isinstance(node, dict):
            if node.get("type") == "object" and node.get("additionalProperties") is not False:
                return f"{at}: 'additionalProperties' is required to be supplied and to be false"
            todo.extend((f"{at}.{k}", v) for k, v in node.items())
        elif isinstance(node, list):
            todo.extend((f"{at}[{i}]", v) for i, v in enumerate(node))
    return None


# --- Wire helpers ------------------------------------------------------------------------


INTERLEAVED_THINKING_BETA = "interleaved-thinking-2025-05-14"


def _before_tool_calls_only(steps: Sequence[Step]) -> list[Step]:
    """The steps but any reasoning after the turn's first tool call."""
    out: list[Step] = []
    called = False
    for step in steps:
        called = called or isinstance(step, ToolCall)
        if not (called and isinstance(step, Thinking | RedactedThinking)):
            out.append(step)
    return out


def _data(payload: Json) -> str:
    return f"data: {json.dumps(payload)}\n\n"


def _event(name: str, payload: Json) -> str:
    return f"event: {name}\ndata: {json.dumps(payload)}\n\n"


def _block_start(index: int, block: Json) -> Json:
    return {"type": "content_block_start", "index": index, "content_block": block}


def _block_delta(index: int, delta: Json) -> Json:
    return {"type": "content_block_delta", "index": index, "delta": delta}


def _block_stop(index: int) -> Json:
    return {"type": "content_block_stop", "index": index}


def _fragments(text: str, count: int) -> Iterator[str]:
    size = max(1, -(-len(text) // max(1, count)))
    for start in range(0, len(text), size):
        yield text[start : start + size]


def _usage_of(steps: Sequence[Step]) -> Usage:
    for step in steps:
        if isinstance(step, Usage):
            return step
    produced = sum(1 for s in steps if isinstance(s, Text | ToolCall | Thinking))
    return Usage(input=10, output=max(1, produced))


def _openai_error_body(kind: str, message: str) -> Json:
    _, error_type, _ = _KINDS.get(kind, _KINDS["server"])
    return {"message": message, "type": error_type, "param": None, "code": _OPENAI_CODES.get(kind)}


def _openai_error(status: int, kind: str | None, message: str) -> Response:
    body = {"error": _openai_error_body(kind or _kind_for_status(status), message)}
    return JSONResponse(body, status_code=status)


def _anthropic_error_body(kind: str, message: str) -> Json:
    _, _, error_type = _KINDS.get(kind, _KINDS["server"])
    return {"type": "error", "error": {"type": error_type, "message": message}}


def _anthropic_error(status: int, kind: str | None, message: str) -> Response:
    body = _anthropic_error_body(kind or _kind_for_status(status), message)
    return JSONResponse(body, status_code=status, headers={"request-id": "req_fake"})
