"""Webhook tools against a real HTTP receiver on 127.0.0.1: signed, retried when worth it, timed
out, and never raising; `verify_signature` refuses what it should."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse

from app.config import Settings
from app.core.tool_loop import PendingCall
from app.tools import webhook
from app.tools.registry import ToolContext, ToolOutcome, execute
from app.tools.webhook import call_webhook, sign, verify_signature
from testkit.server import free_port, serve_in_thread, stop_thread_server

SECRET = "receiver-secret"
CONTEXT = ToolContext("tenant", "session-1", "run-1", "call-1")
CALL = PendingCall("call-1", "lookup", {"city": "Zürich", "days": 2}, 1)


@dataclass
class Delivery:
    path: str
    body: bytes
    headers: dict[str, str]


@dataclass
class Receiver:
    """A webhook endpoint that checks signatures and remembers every delivery."""

    url: str
    deliveries: list[Delivery] = field(default_factory=list)

    def attempts(self, path: str) -> int:
        return sum(d.path == path for d in self.deliveries)


def receiver_app(receiver: Receiver) -> FastAPI:
    app = FastAPI()

    @app.post("/{behaviour}")
    async def deliver(behaviour: str, request: Request) -> Response:
        body = await request.body()
        receiver.deliveries.append(Delivery(behaviour, body, dict(request.headers)))
        signed = verify_signature(
            SECRET,
            request.headers.get("x-threadline-timestamp", ""),
            body,
            request.headers.get("x-threadline-signature", ""),
        )
        if behaviour != "open" and not signed:
            return PlainTextResponse("bad signature", status_code=401)
        payload = json.loads(body)
        if behaviour in ("json", "open"):
            return JSONResponse({"forecast": "sunny", "echo": payload["arguments"]})
        if behaviour == "text":
            return PlainTextResponse("just text")
        if behaviour == "flaky" and receiver.attempts("flaky") < 3:
            return PlainTextResponse("try again", status_code=500)
        if behaviour == "flaky":
            return JSONResponse({"ok": True})
        if behaviour == "down":
            return PlainTextResponse("x" * 2000, status_code=503)
        if behaviour == "slow":
            await asyncio.sleep(0.5)
            return JSONResponse({"late": True})
        return PlainTextResponse(f"no such behaviour: {behaviour}", status_code=400)

    return app


@pytest.fixture(scope="module")
def live_receiver() -> Iterator[Receiver]:
    receiver = Receiver("")
    server, thread, url = serve_in_thread(receiver_app(receiver))
    receiver.url = url
    yield receiver
    stop_thread_server(server, thread)


@pytest.fixture
def receiver(live_receiver: Receiver) -> Receiver:
    live_receiver.deliveries.clear()
    return live_receiver


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as http:
        yield http


async def deliver(
    receiver: Receiver,
    path: str,
    client: httpx.AsyncClient,
    *,
    secret: str | None = SECRET,
    seconds: float = 2,
    max_retries: int = 2,
) -> ToolOutcome:
    return await call_webhook(
        f"{receiver.url}/{path}",
        CALL,
        CONTEXT,
        secret=secret,
        timeout=seconds,
        max_retries=max_retries,
        client=client,
    )


async def test_a_json_answer_is_the_result_and_the_receiver_sees_the_signed_call(
    receiver: Receiver, client: httpx.AsyncClient
) -> None:
    outcome = await deliver(receiver, "json", client)
    assert not outcome.is_error
    assert outcome.content == {"forecast": "sunny", "echo": {"city": "Zürich", "days": 2}}
    [delivery] = receiver.deliveries
    expected = {
        "tool": "lookup",
        "arguments": {"city": "Zürich", "days": 2},
        "session_id": "session-1",
        "run_id": "run-1",
        "tool_call_id": "call-1",
    }
    canonical = json.dumps(expected, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert delivery.body == canonical.encode()
    headers = delivery.headers
    assert headers["content-type"] == "application/json"
    assert headers["idempotency-key"] == "run-1:call-1"
    assert abs(int(headers["x-threadline-timestamp"]) - time.time()) < 5
    message = headers["x-threadline-timestamp"].encode() + b"." + delivery.body
    digest = hmac.new(SECRET.encode(), message, hashlib.sha256).hexdigest()
    assert headers["x-threadline-signature"] == f"sha256={digest}"


async def test_a_text_answer_is_the_result_as_text(
    receiver: Receiver, client: httpx.AsyncClient
) -> None:
    outcome = await deliver(receiver, "text", client)
    assert (outcome.content, outcome.is_error) == ("just text", False)


async def test_a_5xx_is_retried_as_the_same_call_until_it_succeeds(
    receiver: Receiver, client: httpx.AsyncClient
) -> None:
    outcome = await deliver(receiver, "flaky", client, max_retries=2)
    assert (outcome.content, outcome.is_error) == ({"ok": True}, False)
    assert receiver.attempts("flaky") == 3
    assert len({d.headers["idempotency-key"] for d in receiver.deliveries}) == 1
    assert len({d.body for d in receiver.deliveries}) == 1


async def test_retries_are_bounded_and_the_last_answer_is_the_error(
    receiver: Receiver, client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(webhook, "RETRY_BASE_SECONDS", 0.01)
    outcome = await deliver(receiver, "down", client, max_retries=1)
    assert outcome.is_error
    assert "webhook answered 503: " + "x" * 500 in outcome.content
    assert "x" * 501 not in outcome.content
    assert receiver.attempts("down") == 2


async def test_a_4xx_is_not_retried(receiver: Receiver, client: httpx.AsyncClient) -> None:
    outcome = await deliver(receiver, "unknown", client)
    assert outcome.is_error
    assert "webhook answered 400: no such behaviour: unknown" in outcome.content
    assert receiver.attempts("unknown") == 1


async def test_a_slow_receiver_times_out(receiver: Receiver, client: httpx.AsyncClient) -> None:
    started = time.monotonic()
    outcome = await deliver(receiver, "slow", client, seconds=0.1, max_retries=1)
    assert outcome.is_error
    assert "timed out after 0.1 s" in outcome.content
    assert receiver.attempts("slow") == 2
    assert time.monotonic() - started < 1.5  # two 0.1 s tries and one 0.2 s pause


async def test_a_wrong_secret_is_refused_by_the_receiver(
    receiver: Receiver, client: httpx.AsyncClient
) -> None:
    outcome = await deliver(receiver, "json", client, secret="not-the-secret")
    assert outcome.is_error and "webhook answered 401: bad signature" in outcome.content
    assert receiver.attempts("json") == 1


async def test_without_a_secret_the_call_is_unsigned(
    receiver: Receiver, client: httpx.AsyncClient
) -> None:
    outcome = await deliver(receiver, "open", client, secret=None)
    assert not outcome.is_error
    [delivery] = receiver.deliveries
    assert "x-threadline-signature" not in delivery.headers
    assert "x-threadline-timestamp" in delivery.headers


async def test_an_unreachable_url_is_an_error_not_an_exception(
    client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(webhook, "RETRY_BASE_SECONDS", 0.01)
    url = f"http://127.0.0.1:{free_port()}/nobody"
    outcome = await call_webhook(
        url, CALL, CONTEXT, secret=SECRET, timeout=1, max_retries=1, client=client
    )
    assert outcome.is_error and "could not be reached" in outcome.content
    assert "(2 attempts)" in outcome.content
    broken = await call_webhook(
        "nope://x", CALL, CONTEXT, secret=None, timeout=1, max_retries=1, client=client
    )
    assert broken.is_error


def test_verify_signature_refuses_stale_tampered_and_malformed_requests() -> None:
    body = b'{"tool":"lookup"}'
    now = 1_700_000_000.0
    timestamp = str(int(now))
    signature = sign(SECRET, timestamp, body)
    assert verify_signature(SECRET, timestamp, body, signature, now=now)
    assert verify_signature(SECRET, timestamp, body, signature, now=now + 299)
    assert not verify_signature(SECRET, timestamp, body, signature, now=now + 301)  # replayed
    assert not verify_signature(SECRET, timestamp, body, signature, now=now - 301)  # future
    assert not verify_signature(SECRET, timestamp, body + b" ", signature, now=now)  # tampered
    assert not verify_signature("other", timestamp, body, signature, now=now)
    newer = str(int(now) + 10)  # a fresh timestamp does not revive an old signature
    assert not verify_signature(SECRET, newer, body, signature, now=now)
    assert not verify_signature(SECRET, "yesterday", body, signature, now=now)
    assert not verify_signature(SECRET, timestamp, body, "sha256=zz", now=now)
    assert not verify_signature(SECRET, timestamp, body, "sha256=é", now=now)


async def test_the_registry_routes_webhook_tools_with_the_settings(receiver: Receiver) -> None:
    tools: list[dict[str, Any]] = [
        {"name": "lookup", "kind": "webhook", "url": f"{receiver.url}/json", "timeout_seconds": 2}
    ]
    try:
        signed = await execute(
            CALL, tools, CONTEXT, settings=Settings(webhook_secret=SECRET, webhook_max_retries=0)
        )
        assert (signed.content["forecast"], signed.is_error) == ("sunny", False)
        unsigned = await execute(CALL, tools, CONTEXT)  # no settings: unsigned, refused
        assert unsigned.is_error and "answered 401" in unsigned.content
        no_url = await execute(CALL, [{"name": "lookup", "kind": "webhook"}], CONTEXT)
        assert no_url.is_error and "no url" in no_url.content
    finally:
        await webhook.aclose_shared_client()
