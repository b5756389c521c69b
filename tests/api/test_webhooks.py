"""Completion webhooks against a live service: every terminal run (and a run waiting for client
tools) reaches a local receiver as a Standard Webhooks POST whose signature the reference
verifier accepts; failures are retried and logged; a delivery queued while no worker runs and
the receiver is down is made once both are back."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.fernet import Fernet
from sqlalchemy import text
from standardwebhooks import Webhook as Verifier

from app.config import Settings
from app.credentials import Vault, local_key, vault_for
from app.db.engine import create_engine
from app.main import create_app
from app.services import webhooks as webhooks_service
from app.services.keys import create_key
from app.worker.pool import worker_pool
from testkit.api import ended_run, new_session
from testkit.server import serve_in_thread, stop_thread_server
from testkit.sse_client import collect
from testkit.upstream import Fail, FakeUpstream, Text, ToolCall, Usage
from testkit.webhook_receiver import Received, WebhookReceiver
from tests.e2e import create_database, e2e_env

LOCATE = {"name": "get_location", "kind": "client", "description": "Where the user is"}


def hook_settings(database_url: str, upstream: FakeUpstream, **overrides: Any) -> Settings:
    """A database of its own (other tests' workers must not deliver these webhooks), retries at
    once: the tests count attempts, not seconds."""
    values: dict[str, Any] = {
        **e2e_env(upstream),
        "run_webhook_backoff_seconds": 0,
        "run_webhook_max_attempts": 4,
        "tool_outputs_timeout_seconds": 600,  # a run waits for its cancel, however slow
    }
    return Settings(database_url=create_database(database_url, "webhooks"), **(values | overrides))


@pytest.fixture(scope="module")
def hooks_service(database_url: str, upstream: FakeUpstream) -> Iterator[tuple[str, Settings]]:
    settings = hook_settings(database_url, upstream)
    server, thread, url = serve_in_thread(create_app(settings, workers=2))
    yield url, settings
    stop_thread_server(server, thread)


async def tenant_client(url: str, settings: Settings) -> tuple[httpx.AsyncClient, str]:
    engine = create_engine(settings)
    tenant = f"hooks-{uuid.uuid4()}"
    try:
        key = await create_key(engine, tenant)
    finally:
        await engine.dispose()
    client = httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60)
    return client, tenant


@pytest.fixture
async def hooks(
    hooks_service: tuple[str, Settings], upstream: FakeUpstream
) -> AsyncIterator[httpx.AsyncClient]:
    upstream.clear()
    client, _ = await tenant_client(*hooks_service)
    async with client:
        yield client


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    with WebhookReceiver() as running:
        yield running


async def register(client: httpx.AsyncClient, url: str, **body: Any) -> dict[str, Any]:
    response = await client.post("/v1/webhooks", json={"url": url, **body})
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    assert created["secret"].startswith("whsec_")
    return created


def readme_verifier() -> Any:
    """The README's receiver example, run as written: its `verified` function."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme[readme.index("### Completion webhooks") :]
    block = section[section.index("```python\n") + len("```python\n") :]
    namespace: dict[str, Any] = {}
    exec(block[: block.index("```")], namespace)
    return namespace["verified"]


def verified(secret: str, received: Received) -> dict[str, Any]:
    """The payload, once the reference verifier accepted its signature (it raises if not), as
    the README shows it."""
    payload: dict[str, Any] = readme_verifier()(secret, received.body.encode(), received.headers)
    assert payload == json.loads(received.body)
    return payload


async def deliveries(
    client: httpx.AsyncClient, webhook_id: str, *, settled: int
) -> list[dict[str, Any]]:
    """The delivery log once `settled` of its deliveries are delivered or failed."""
    deadline = time.monotonic() + 120
    while True:
        response = await client.get(f"/v1/webhooks/{webhook_id}/deliveries")
        assert response.status_code == 200, response.text
        log: list[dict[str, Any]] = response.json()["data"]
        if sum(d["status"] != "pending" for d in log) >= settled:
            return log
        assert time.monotonic() < deadline, log
        await asyncio.sleep(0.05)


async def ask(client: httpx.AsyncClient, sid: str, text: str) -> str:
    response = await client.post(f"/v1/sessions/{sid}/ask", json={"input": text, "stream": False})
    assert response.status_code == 202, response.text
    run_id: str = response.json()["id"]
    return run_id


async def test_a_completed_run_is_posted_signed(
    hooks: httpx.AsyncClient, receiver: WebhookReceiver, upstream: FakeUpstream
) -> None:
    hook = await register(hooks, receiver.url)
    sid = (await new_session(hooks, metadata={"user": "ada"}))["id"]
    upstream.script(Text("Hello"), Text(" there"), Usage(12, 3))
    run_id = await ask(hooks, sid, "hi")
    assert (await ended_run(hooks, run_id))["status"] == "completed"

    (received,) = await receiver.wait_for(1)
    payload = verified(hook["secret"], received)
    assert payload["type"] == "run.completed"
    data = payload["data"]
    assert (data["run_id"], data["session_id"], data["status"]) == (run_id, sid, "completed")
    assert data["text"] == "Hello there" and data["finish_reason"] == "stop"
    assert data["usage"]["input_tokens"] == 12 and data["usage"]["output_tokens"] == 3
    assert received.headers["content-type"] == "application/json"

    (logged,) = await deliveries(hooks, hook["id"], settled=1)
    assert logged["id"] == received.headers["webhook-id"]
    assert (logged["status"], logged["attempts"], logged["last_status_code"]) == (
        "delivered",
        1,
        200,
    )
    assert logged["run_id"] == run_id and logged["payload"] == payload
    assert logged["delivered_at"] is not None and logged["last_error"] is None
    # A tampered body (or another secret) fails verification: the signature covers the bytes.
    tampered = Received(received.headers, received.body.replace("Hello", "Howdy"), 200)
    with pytest.raises(Exception, match=r"(?i)signature"):
        verified(hook["secret"], tampered)
    listed = (await hooks.get("/v1/webhooks")).json()["data"]
    assert [w["id"] for w in listed] == [hook["id"]] and "secret" not in listed[0]


async def test_a_failing_receiver_is_retried_until_it_answers(
    hooks: httpx.AsyncClient, receiver: WebhookReceiver, upstream: FakeUpstream
) -> None:
    hook = await register(hooks, receiver.url)
    receiver.fail_next(500, 503)
    sid = (await new_session(hooks))["id"]
    upstream.script(Text("third time lucky"))
    run_id = await ask(hooks, sid, "go")
    attempts = await receiver.wait_for(3)
    assert [a.answered for a in attempts] == [500, 503, 200]
    # One message: the same id on every attempt, each one signed afresh and verifiable.
    assert len({a.headers["webhook-id"] for a in attempts}) == 1
    assert {verified(hook["secret"], a)["data"]["run_id"] for a in attempts} == {run_id}
    (logged,) = await deliveries(hooks, hook["id"], settled=1)
    assert (logged["status"], logged["attempts"], logged["last_status_code"]) == (
        "delivered",
        3,
        200,
    )


async def test_a_receiver_that_keeps_failing_is_given_up_on(
    hooks: httpx.AsyncClient, receiver: WebhookReceiver, upstream: FakeUpstream
) -> None:
    hook = await register(hooks, receiver.url)
    receiver.fail_next(500, 500, 500, 500, 500)
    sid = (await new_session(hooks))["id"]
    await ask(hooks, sid, "go")
    (logged,) = await deliveries(hooks, hook["id"], settled=1)
    assert (logged["status"], logged["attempts"], logged["last_status_code"]) == (
        "failed",
        4,  # the service's run_webhook_max_attempts
        500,
    )
    assert "500" in logged["last_error"] and logged["delivered_at"] is None
    assert len(receiver.received) == 4


async def test_failed_requires_action_and_cancelled_runs_are_posted(
    hooks: httpx.AsyncClient, receiver: WebhookReceiver, upstream: FakeUpstream
) -> None:
    hook = await register(hooks, receiver.url)
    sid = (await new_session(hooks, config={"tools": [LOCATE]}))["id"]

    upstream.script(Fail(400, "bad_request", "no such model"))
    failed = await ask(hooks, sid, "fail")
    assert (await ended_run(hooks, failed))["status"] == "failed"
    upstream.script(ToolCall("call_loc", "get_location", "{}"))
    waiting = await ask(hooks, sid, "where am I?")
    await collect(hooks, "GET", f"/v1/runs/{waiting}/events", until="run.requires_action")
    first, second = await receiver.wait_for(2)
    assert (await hooks.post(f"/v1/runs/{waiting}/cancel")).status_code == 200
    *_, third = await receiver.wait_for(3)

    # Deliveries run concurrently: the first two may arrive in either order.
    early = [verified(hook["secret"], r) for r in (first, second)]
    payloads = [
        *sorted(early, key=lambda p: p["type"] != "run.failed"),
        verified(hook["secret"], third),
    ]
    assert [(p["type"], p["data"]["run_id"]) for p in payloads] == [
        ("run.failed", failed),
        ("run.requires_action", waiting),
        ("run.cancelled", waiting),
    ]
    assert payloads[0]["data"]["error"]["code"]
    calls = payloads[1]["data"]["tool_calls"]
    assert [c["name"] for c in calls] == ["get_location"]
    assert payloads[2]["data"]["status"] == "cancelled"
    log = await deliveries(hooks, hook["id"], settled=3)
    assert [d["event_type"] for d in log] == ["run.cancelled", "run.requires_action", "run.failed"]
    # The log in pages, newest first.
    path = f"/v1/webhooks/{hook['id']}/deliveries"
    first_page = (await hooks.get(path, params={"limit": 2})).json()
    assert first_page["has_more"] is True
    rest = (await hooks.get(path, params={"limit": 2, "cursor": first_page["next_cursor"]})).json()
    assert rest["has_more"] is False and rest["next_cursor"] is None
    assert [d["id"] for d in first_page["data"] + rest["data"]] == [d["id"] for d in log]
    bad = await hooks.get(path, params={"cursor": "not-a-cursor"})
    assert bad.status_code == 422 and bad.json()["error"]["code"] == "invalid_cursor"
    too_many = await hooks.get(path, params={"limit": 1000})
    assert too_many.status_code == 422 and too_many.json()["error"]["code"] == "limit_too_large"


async def test_session_webhooks_and_event_filters(
    hooks: httpx.AsyncClient, receiver: WebhookReceiver, upstream: FakeUpstream
) -> None:
    watched = (await new_session(hooks))["id"]
    other = (await new_session(hooks))["id"]
    session_hook = await register(hooks, receiver.url, session_id=watched)
    failures_only = await register(hooks, receiver.url, event_types=["run.failed"])
    assert session_hook["session_id"] == watched and failures_only["event_types"] == ["run.failed"]

    await ended_run(hooks, await ask(hooks, other, "not watched"))
    done = await ask(hooks, watched, "watched")
    await ended_run(hooks, done)
    upstream.script(Fail(400, "bad_request", "nope"))
    failed = await ask(hooks, other, "fails")
    await ended_run(hooks, failed)

    received = await receiver.wait_for(2)
    by_hook = {
        name: [verified(hook["secret"], r) for r in received if _signed_by(hook, r)]
        for name, hook in (("session", session_hook), ("failures", failures_only))
    }
    assert [(p["type"], p["data"]["run_id"]) for p in by_hook["session"]] == [
        ("run.completed", done)
    ]
    assert [(p["type"], p["data"]["run_id"]) for p in by_hook["failures"]] == [
        ("run.failed", failed)
    ]
    # The logs are written as runs end: complete now that all three ended.
    for hook, run_id in ((session_hook, done), (failures_only, failed)):
        log = await deliveries(hooks, hook["id"], settled=1)
        assert [d["run_id"] for d in log] == [run_id]
    # Deleting the session deletes its webhook; deleting a webhook deletes its log.
    assert (await hooks.delete(f"/v1/sessions/{watched}")).status_code == 204
    assert (await hooks.get(f"/v1/webhooks/{session_hook['id']}")).status_code == 404
    assert (await hooks.delete(f"/v1/webhooks/{failures_only['id']}")).status_code == 204
    gone = await hooks.get(f"/v1/webhooks/{failures_only['id']}/deliveries")
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "webhook_not_found"
    assert (await hooks.get("/v1/webhooks")).json()["data"] == []


def _signed_by(hook: dict[str, Any], received: Received) -> bool:
    try:
        Verifier(hook["secret"]).verify(received.body, received.headers)
    except Exception:
        return False
    return True


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"url": "ftp://example.com/hook"}, 422, "invalid_url"),
        ({"url": "not a url"}, 422, "invalid_url"),
        ({"url": "http://"}, 422, "invalid_url"),
        ({"url": "http://example.com:notaport/"}, 422, "invalid_url"),
        ({"url": "javascript:alert(1)"}, 422, "invalid_url"),
        ({"url": ""}, 422, "validation_error"),
        ({"url": "https://example.com", "event_types": ["run.exploded"]}, 422, None),
        ({"url": "https://example.com", "event_types": []}, 422, None),
        ({"url": "https://example.com", "session_id": "nope"}, 422, None),
        ({"url": "https://example.com", "session_id": str(uuid.uuid4())}, 404, None),
        ({"url": "https://example.com", "secret": "mine"}, 422, None),
        ({}, 422, None),
    ],
)
async def test_bad_registrations_are_refused(
    hooks: httpx.AsyncClient, body: dict[str, Any], status: int, code: str | None
) -> None:
    response = await hooks.post("/v1/webhooks", json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) >= {"code", "message", "details"}
    if code is not None:
        assert error["code"] == code
    assert (await hooks.get("/v1/webhooks")).json()["data"] == []


async def test_other_tenants_webhooks_and_sessions_are_invisible(
    hooks: httpx.AsyncClient, hooks_service: tuple[str, Settings], receiver: WebhookReceiver
) -> None:
    theirs = await register(hooks, receiver.url)
    their_session = (await new_session(hooks))["id"]
    other, _ = await tenant_client(*hooks_service)
    async with other:
        for method, path in [
            ("GET", f"/v1/webhooks/{theirs['id']}"),
            ("GET", f"/v1/webhooks/{theirs['id']}/deliveries"),
            ("DELETE", f"/v1/webhooks/{theirs['id']}"),
        ]:
            assert (await other.request(method, path)).status_code == 404
        assert (await other.get("/v1/webhooks")).json()["data"] == []
        response = await other.post(
            "/v1/webhooks", json={"url": receiver.url, "session_id": their_session}
        )
        assert response.status_code == 404
    assert (await hooks.get(f"/v1/webhooks/{theirs['id']}")).status_code == 200


@pytest.fixture
def slow_retries(database_url: str, upstream: FakeUpstream) -> Settings:
    """Attempts a second apart, as many as it takes."""
    return hook_settings(
        database_url, upstream, run_webhook_backoff_seconds=1, run_webhook_max_attempts=1000
    )


async def test_a_delivery_survives_a_restart_with_the_receiver_down(
    slow_retries: Settings,
) -> None:
    """Queued by an API with no worker, the receiver down: a worker started later fails to
    reach it (logged), then delivers once the receiver is up."""
    settings = slow_retries
    receiver = WebhookReceiver()  # not started: the port refuses connections
    server, thread, url = serve_in_thread(create_app(settings))  # the API alone
    try:
        client, _ = await tenant_client(url, settings)
        async with client:
            hook = await register(client, receiver.url)
            sid = (await new_session(client))["id"]
            run_id = await ask(client, sid, "nobody runs this")
            # No worker took the run: cancelling it ends it in this API's transaction.
            assert (await client.post(f"/v1/runs/{run_id}/cancel")).json()["status"] == (
                "cancelled"
            )
            (queued,) = (await client.get(f"/v1/webhooks/{hook['id']}/deliveries")).json()["data"]
            assert (queued["status"], queued["attempts"]) == ("pending", 0)
    finally:
        stop_thread_server(server, thread)

    engine = create_engine(settings)
    try:
        async with worker_pool(settings, 1, engine):
            server, thread, url = serve_in_thread(create_app(settings))
            try:
                async with httpx.AsyncClient(
                    base_url=url, headers=_auth(client), timeout=60
                ) as client:
                    refused = await _wait_attempted(client, hook["id"])
                    assert refused["status"] == "pending" and refused["last_status_code"] is None
                    assert "ConnectError" in refused["last_error"]
                    with receiver:
                        (received,) = await receiver.wait_for(1)
                        (logged,) = await deliveries(client, hook["id"], settled=1)
            finally:
                stop_thread_server(server, thread)
    finally:
        await engine.dispose()
    payload = verified(hook["secret"], received)
    assert (payload["type"], payload["data"]["run_id"]) == ("run.cancelled", run_id)
    assert logged["status"] == "delivered" and logged["attempts"] >= 2


def _auth(client: httpx.AsyncClient) -> dict[str, str]:
    return {"Authorization": client.headers["Authorization"]}


async def _wait_attempted(client: httpx.AsyncClient, webhook_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 120
    while True:
        (delivery,) = (await client.get(f"/v1/webhooks/{webhook_id}/deliveries")).json()["data"]
        if delivery["attempts"] >= 1:
            return dict(delivery)
        assert time.monotonic() < deadline, delivery
        await asyncio.sleep(0.05)


async def test_the_signing_secret_is_stored_encrypted_and_reencrypted_under_a_new_key(
    hooks: httpx.AsyncClient, hooks_service: tuple[str, Settings]
) -> None:
    """The row alone signs nothing: it holds a Fernet token of the secret, which `threadline
    secrets reencrypt` moves to the newest key like every stored credential."""
    _, settings = hooks_service
    hook = await register(hooks, "https://hooks.example.com/done")
    engine = create_engine(settings)

    async def stored() -> str:
        async with engine.connect() as conn:
            row = await conn.execute(
                text("SELECT encrypted_secret FROM webhook_endpoints WHERE id = :id"),
                {"id": hook["id"]},
            )
            value: str = row.scalar_one()
            return value

    try:
        token = await stored()
        assert hook["secret"] not in token and not token.startswith("whsec_")
        assert vault_for(settings).decrypt(token) == hook["secret"]
        old = local_key(settings.data_dir)
        new = Fernet.generate_key().decode()
        try:
            assert await webhooks_service.reencrypt(engine, Vault([new, old])) >= 1
            assert Vault([new]).decrypt(await stored()) == hook["secret"]
        finally:  # the module's service still has only the old key
            await webhooks_service.reencrypt(engine, Vault([old, new]))
        assert Vault([old]).decrypt(await stored()) == hook["secret"]
    finally:
        await engine.dispose()
