"""Stream tokens over real HTTP: issued by an API key, they open exactly the streams they name
(no Authorization needed), until they expire; nothing else opens with them."""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from app.api.schemas import DEFAULT_STREAM_TOKEN_SECONDS
from app.config import Settings
from app.core.stream_tokens import StreamGrant, sign
from app.main import create_app
from testkit.api import new_session
from testkit.server import serve_in_thread, stop_thread_server
from testkit.sse_client import read_to_end
from testkit.upstream import FakeUpstream, Text
from tests.conftest import LiveServer, issue_key
from tests.e2e import Service


def auth(server: LiveServer) -> dict[str, str]:
    return {"Authorization": f"Bearer {server.key}"}


def issue(server: LiveServer, **body: Any) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/stream_tokens", json=body, headers=auth(server))


def session(server: LiveServer) -> str:
    created = httpx.post(f"{server.url}/v1/sessions", json={}, headers=auth(server))
    session_id: str = created.json()["id"]
    return session_id


def error(response: httpx.Response) -> str:
    code: str = response.json()["error"]["code"]
    return code


def test_a_session_token_opens_its_session_stream_and_no_other(live_server: LiveServer) -> None:
    mine, other = session(live_server), session(live_server)
    issued = issue(live_server, session_id=mine)
    assert issued.status_code == 201, issued.text
    body = issued.json()
    assert body["session_id"] == mine and body["run_id"] is None
    assert body["stream_url"] == f"/v1/sessions/{mine}/stream?token={body['token']}"
    expires_at = datetime.fromisoformat(body["expires_at"])
    issued_at = datetime.now(UTC)
    assert issued_at < expires_at <= issued_at + timedelta(seconds=DEFAULT_STREAM_TOKEN_SECONDS)

    # No Authorization: the token alone opens it (no run in progress: 204).
    opened = httpx.get(f"{live_server.url}{body['stream_url']}")
    assert opened.status_code == 204, opened.text
    refused = httpx.get(f"{live_server.url}/v1/sessions/{other}/stream?token={body['token']}")
    assert refused.status_code == 403 and error(refused) == "stream_token_scope"
    # Only streams: the token is no API key.
    for path in (f"/v1/sessions/{mine}", f"/v1/sessions/{mine}/entries", "/v1/sessions"):
        response = httpx.get(f"{live_server.url}{path}?token={body['token']}")
        assert response.status_code == 401, path
        assert response.headers["www-authenticate"] == "Bearer"


def test_bad_expired_and_missing_tokens_are_refused(live_server: LiveServer) -> None:
    sid = session(live_server)
    stream = f"{live_server.url}/v1/sessions/{sid}/stream"
    for token, code in (
        ("nonsense", "invalid_stream_token"),
        (live_server.key, "invalid_stream_token"),
    ):
        refused = httpx.get(stream, params={"token": token})
        assert refused.status_code == 401 and error(refused) == code, refused.text
        assert refused.headers["www-authenticate"] == "Bearer"
    refused = httpx.get(stream)
    assert refused.status_code == 401 and error(refused) == "unauthorized"
    # Signed by another server (another secret): not this server's token.
    foreign = sign(b"another server's secret", StreamGrant("t", "session", sid, 2**40))
    refused = httpx.get(stream, params={"token": foreign})
    assert refused.status_code == 401 and error(refused) == "invalid_stream_token"


def test_an_expired_token_is_refused(app_secret_server: tuple[LiveServer, bytes]) -> None:
    server, secret = app_secret_server
    sid = session(server)
    tenant = tenant_of(server, sid)
    expired = sign(secret, StreamGrant(tenant, "session", sid, int(time.time()) - 1))
    refused = httpx.get(f"{server.url}/v1/sessions/{sid}/stream", params={"token": expired})
    assert refused.status_code == 401 and error(refused) == "stream_token_expired", refused.text
    valid = sign(secret, StreamGrant(tenant, "session", sid, int(time.time()) + 60))
    opened = httpx.get(f"{server.url}/v1/sessions/{sid}/stream", params={"token": valid})
    assert opened.status_code == 204, opened.text


def tenant_of(server: LiveServer, sid: str) -> str:
    """The tenant id a token of this server names (read from one it issued)."""
    token = issue(server, session_id=sid).json()["token"]
    payload = token.split(".")[1]
    tenant: str = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))["t"]
    return tenant


def test_issuing_is_checked(live_server: LiveServer) -> None:
    sid = session(live_server)
    for body in ({}, {"session_id": sid, "run_id": str(uuid.uuid4())}, {"session_id": "nope"}):
        refused = issue(live_server, **body)
        assert refused.status_code == 422 and error(refused) == "validation_error", body
    too_long = issue(live_server, session_id=sid, expires_in=3601)
    assert too_long.status_code == 422 and error(too_long) == "expires_in_too_long"
    for body in ({"session_id": str(uuid.uuid4())}, {"run_id": str(uuid.uuid4())}):
        assert issue(live_server, **body).status_code == 404, body
    anonymous = httpx.post(f"{live_server.url}/v1/stream_tokens", json={"session_id": sid})
    assert anonymous.status_code == 401


@pytest.fixture(scope="module")
def app_secret_server(settings: Settings) -> Iterator[tuple[LiveServer, bytes]]:
    """The API under uvicorn with a configured token secret (so the test can sign tokens)."""
    secret = "a configured secret for the tests"
    configured = settings.model_copy(update={"stream_token_secret": secret})
    server, thread, url = serve_in_thread(create_app(configured))
    yield LiveServer(url, issue_key(configured, f"tokens-{uuid.uuid4()}")), secret.encode()
    stop_thread_server(server, thread)


async def test_tokens_open_whole_runs_without_authorization(
    api: httpx.AsyncClient, service: Service, upstream: FakeUpstream
) -> None:
    """What an EventSource does: GET the stream URL, no Authorization; resume after an id."""
    sid = (await new_session(api))["id"]
    other = (await new_session(api))["id"]
    upstream.script(Text("Hel"), Text("lo"))
    run = (await api.post(f"/v1/sessions/{sid}/ask", json={"input": "hi", "stream": False})).json()
    by_run = (await api.post("/v1/stream_tokens", json={"run_id": run["id"]})).json()
    by_session = (await api.post("/v1/stream_tokens", json={"session_id": sid})).json()
    by_other = (await api.post("/v1/stream_tokens", json={"session_id": other})).json()
    assert by_run["stream_url"] == f"/v1/runs/{run['id']}/events?token={by_run['token']}"

    async with httpx.AsyncClient(base_url=service.url, timeout=30) as browser:
        whole = await read_to_end(browser, "GET", by_run["stream_url"])
        assert whole.status == 200
        assert whole.events[-1].type == "run.completed"
        assert whole.events[-1].data["text"] == "Hello"
        # A session's token opens the events of its runs too, resuming where told.
        events = f"/v1/runs/{run['id']}/events"
        rest = await read_to_end(
            browser, "GET", events, params={"token": by_session["token"], "starting_after": 2}
        )
        assert rest.status == 200 and rest.events == whole.events[2:]
        refused = await browser.get(events, params={"token": by_other["token"]})
        assert refused.status_code == 403 and error(refused) == "stream_token_scope"
