"""Webhook tools: the worker POSTs the call to a URL, signed, with a timeout and bounded retries;
the response body is the result.

The request
    POST <url> with the canonical JSON (sorted keys, no whitespace, UTF-8) of
    ``{"tool", "arguments", "session_id", "run_id", "tool_call_id"}`` and the headers
    ``Content-Type: application/json``, ``X-Threadline-Timestamp: <unix seconds>``,
    ``Idempotency-Key: <run_id>:<tool_call_id>`` (a retried delivery is the same call: receivers
    should answer a repeated key with the first answer), and, when ``THREADLINE_WEBHOOK_SECRET`` is
    set, ``X-Threadline-Signature: sha256=<hex>``.

The signature, for receivers to verify
    hex(HMAC-SHA256(key=secret, msg=timestamp + "." + body)), where ``timestamp`` is the
    header's value as sent and ``body`` the raw request bytes (verify before parsing them).
    Reject timestamps far from now (5 minutes by default): signing the timestamp stops a captured
    request from being replayed later. `verify_signature` does all of this in constant time.

The answer
    2xx: the result is the parsed body if its content type is JSON, else its text. Other statuses
    are an error result ("webhook answered <status>: <first 500 chars>"). 429, 5xx, connection
    failures and timeouts are tried again, at most ``max_retries`` more times, 0.2 s apart and
    doubling; every attempt has the whole ``timeout``. Nothing here raises: failures are results
    the model can read.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
from dataclasses import dataclass
from typing import Any

import httpx

from app.core.tool_loop import PendingCall
from app.tools.context import ToolContext, ToolOutcome

SIGNATURE_HEADER = "X-Threadline-Signature"
TIMESTAMP_HEADER = "X-Threadline-Timestamp"
RETRY_BASE_SECONDS = 0.2
MAX_RESPONSE_BYTES = 1_048_576  # a tool result lands in the journal: bigger answers are errors
ERROR_EXCERPT_CHARS = 500

_shared: tuple[asyncio.AbstractEventLoop, httpx.AsyncClient] | None = None


def shared_client() -> httpx.AsyncClient:
    """The process's client (connection pooling across calls), made on first use.

    A client's pool belongs to one event loop: a new loop gets a new client.
    """
    global _shared
    loop = asyncio.get_running_loop()
    if _shared is None or _shared[0] is not loop or _shared[1].is_closed:
        _shared = (loop, httpx.AsyncClient(follow_redirects=False))
    return _shared[1]


async def aclose_shared_client() -> None:
    """Close the shared client (at shutdown); the next call makes a new one."""
    global _shared
    if _shared is not None and _shared[0] is asyncio.get_running_loop():
        await _shared[1].aclose()
    _shared = None


def canonical_body(call: PendingCall, context: ToolContext) -> bytes:
    payload = {
        "tool": call.name,
        "arguments": call.arguments,
        "session_id": context.session_id,
        "run_id": context.run_id,
        "tool_call_id": context.tool_call_id,
    }
    return json.dumps(
        payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode()


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """The X-Threadline-Signature value of a request: ``sha256=<hex HMAC of "<ts>.<body>">``."""
    message = timestamp.encode() + b"." + body
    return "sha256=" + hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def verify_signature(
    secret: str,
    timestamp: str,
    body: bytes,
    signature: str,
    *,
    max_age_seconds: float = 300,
    now: float | None = None,
) -> bool:
    """Whether a webhook request is ours and fresh: signed with `secret`, timestamp within
    `max_age_seconds` of `now` (either way). The comparison takes constant time."""
    try:
        sent = int(timestamp)
    except ValueError:
        return False
    current = time.time() if now is None else now
    if abs(current - sent) > max_age_seconds:
        return False
    expected = sign(secret, timestamp, body).encode()
    return hmac.compare_digest(expected, signature.encode("utf-8", "replace"))


async def call_webhook(
    url: str,
    call: PendingCall,
    context: ToolContext,
    *,
    secret: str | None,
    timeout: float,  # noqa: ASYNC109 - per attempt, and httpx needs it too
    max_retries: int,
    client: httpx.AsyncClient | None = None,
) -> ToolOutcome:
    """Deliver one tool call to its webhook; the answer (or why there is none) is the outcome."""
    try:
        body = canonical_body(call, context)
    except (TypeError, ValueError) as exc:
        return _error(f"{call.name} arguments are not JSON: {exc}")
    http = client if client is not None else shared_client()
    failure = ""
    attempts = 0
    while attempts <= max(0, max_retries):
        if attempts:
            await asyncio.sleep(RETRY_BASE_SECONDS * 2 ** (attempts - 1))
        attempts += 1
        timestamp = str(int(time.time()))
        headers = {
            "Content-Type": "application/json",
            TIMESTAMP_HEADER: timestamp,
            "Idempotency-Key": f"{context.run_id}:{context.tool_call_id}",
        }
        if secret:
            headers[SIGNATURE_HEADER] = sign(secret, timestamp, body)
        try:
            async with asyncio.timeout(timeout):
                answer = await _post(http, url, body, headers, httpx.Timeout(timeout))
        except (TimeoutError, httpx.TimeoutException):
            failure = f"{call.name} webhook timed out after {timeout:g} s"
            continue
        except _TooLarge:
            return _error(f"{call.name} webhook answered more than {MAX_RESPONSE_BYTES} bytes")
        except httpx.UnsupportedProtocol as exc:  # not http(s): no retry will fix it
            return _error(f"{call.name} webhook failed: {exc!r}")
        except httpx.TransportError as exc:
            failure = f"{call.name} webhook could not be reached: {exc!r}"
            continue
        except Exception as exc:  # a malformed URL or the like: not worth another try
            return _error(f"{call.name} webhook failed: {exc!r}")
        if 200 <= answer.status < 300:
            return ToolOutcome(answer.result())
        excerpt = answer.text()[:ERROR_EXCERPT_CHARS]
        failure = f"{call.name} webhook answered {answer.status}: {excerpt}"
        if answer.status != 429 and answer.status < 500:
            break
    return _error(failure + (f" ({attempts} attempts)" if attempts > 1 else ""))


class _TooLarge(Exception):
    pass


@dataclass(frozen=True)
class _Answer:
    status: int
    content_type: str
    data: bytes
    charset: str

    def text(self) -> str:
        try:
            return self.data.decode(self.charset, errors="replace")
        except LookupError:  # a charset Python does not know
            return self.data.decode("utf-8", errors="replace")

    def result(self) -> Any:
        media_type = self.content_type.split(";", 1)[0].strip().lower()
        if media_type == "application/json" or media_type.endswith("+json"):
            try:
                return json.loads(self.text())
            except ValueError:
                pass  # says JSON, is not: the text is still worth reading
        return self.text()


async def _post(
    http: httpx.AsyncClient, url: str, body: bytes, headers: dict[str, str], limits: httpx.Timeout
) -> _Answer:
    """The answer, its body read up to the size cap."""
    async with http.stream("POST", url, content=body, headers=headers, timeout=limits) as answer:
        chunks: list[bytes] = []
        size = 0
        async for chunk in answer.aiter_bytes():
            size += len(chunk)
            if size > MAX_RESPONSE_BYTES:
                raise _TooLarge
            chunks.append(chunk)
        return _Answer(
            answer.status_code,
            answer.headers.get("content-type", ""),
            b"".join(chunks),
            answer.charset_encoding or "utf-8",
        )


def _error(message: str) -> ToolOutcome:
    return ToolOutcome(f"Error: {message}.", is_error=True)
