"""CORS, as a browser meets it over real HTTP: configured origins only, real preflights, the
headers a page needs exposed, and streams opened cross-origin with a stream token."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from app.config import Settings
from app.main import CORS_EXPOSED_HEADERS, create_app
from testkit.server import serve_in_thread, stop_thread_server
from tests.conftest import LiveServer, issue_key

PAGE = "https://chat.example.com"
ELSEWHERE = "https://evil.example.net"


@pytest.fixture(scope="module")
def cors_server(settings: Settings) -> Iterator[LiveServer]:
    configured = settings.model_copy(update={"cors_origins": [PAGE, "http://localhost:5173"]})
    server, thread, url = serve_in_thread(create_app(configured))
    yield LiveServer(url, issue_key(configured, "cors"))
    stop_thread_server(server, thread)


def preflight(url: str, origin: str, method: str, headers: str) -> httpx.Response:
    return httpx.options(
        url,
        headers={
            "Origin": origin,
            "Access-Control-Request-Method": method,
            "Access-Control-Request-Headers": headers,
        },
    )


def test_a_configured_origin_passes_the_preflight_of_an_ask(cors_server: LiveServer) -> None:
    url = f"{cors_server.url}/v1/sessions/00000000-0000-0000-0000-000000000000/ask"
    allowed = preflight(url, PAGE, "POST", "authorization,content-type,idempotency-key")
    assert allowed.status_code == 200, allowed.text
    assert allowed.headers["access-control-allow-origin"] == PAGE
    assert "POST" in allowed.headers["access-control-allow-methods"]
    granted = allowed.headers["access-control-allow-headers"].lower()
    for header in ("authorization", "content-type", "idempotency-key", "last-event-id"):
        assert header in granted, header
    assert "access-control-allow-credentials" not in allowed.headers  # no cookies involved

    refused = preflight(url, ELSEWHERE, "POST", "authorization,content-type")
    assert refused.status_code == 400
    assert "access-control-allow-origin" not in refused.headers


def test_answers_carry_the_origin_and_expose_what_a_page_reads(cors_server: LiveServer) -> None:
    auth = {"Authorization": f"Bearer {cors_server.key}"}
    created = httpx.post(
        f"{cors_server.url}/v1/sessions", json={}, headers={**auth, "Origin": PAGE}
    )
    assert created.status_code == 201
    assert created.headers["access-control-allow-origin"] == PAGE
    exposed = {
        h.strip().lower() for h in created.headers["access-control-expose-headers"].split(",")
    }
    assert {h.lower() for h in CORS_EXPOSED_HEADERS} <= exposed
    # Refusals too: a page can read why (and the 401's WWW-Authenticate).
    refused = httpx.get(f"{cors_server.url}/v1/sessions", headers={"Origin": PAGE})
    assert refused.status_code == 401
    assert refused.headers["access-control-allow-origin"] == PAGE
    # Another origin's page gets the answer without CORS headers: its browser hides it.
    other = httpx.get(f"{cors_server.url}/v1/sessions", headers={**auth, "Origin": ELSEWHERE})
    assert "access-control-allow-origin" not in other.headers


def test_an_eventsource_opens_a_stream_cross_origin_with_a_token(cors_server: LiveServer) -> None:
    """What EventSource sends: a GET with Origin and Accept, no Authorization."""
    auth = {"Authorization": f"Bearer {cors_server.key}"}
    sid = httpx.post(f"{cors_server.url}/v1/sessions", json={}, headers=auth).json()["id"]
    token = httpx.post(
        f"{cors_server.url}/v1/stream_tokens", json={"session_id": sid}, headers=auth
    ).json()
    opened = httpx.get(
        f"{cors_server.url}{token['stream_url']}",
        headers={"Origin": PAGE, "Accept": "text/event-stream", "Last-Event-ID": "3"},
    )
    assert opened.status_code == 204  # no run in progress: nothing to stream, no reconnects
    assert opened.headers["access-control-allow-origin"] == PAGE


def test_no_origin_is_allowed_by_default(live_server: LiveServer) -> None:
    assert Settings().cors_origins == []
    url = f"{live_server.url}/v1/sessions"
    refused = preflight(url, PAGE, "POST", "authorization,content-type")
    assert refused.status_code == 405  # no CORS: OPTIONS is no method of the API
    assert "access-control-allow-origin" not in refused.headers
    answered = httpx.get(url, headers={"Origin": PAGE})
    assert "access-control-allow-origin" not in answered.headers


def test_origins_are_read_comma_separated_or_as_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("THREADLINE_CORS_ORIGINS", f" {PAGE}, http://localhost:5173 ")
    assert Settings().cors_origins == [PAGE, "http://localhost:5173"]
    monkeypatch.setenv("THREADLINE_CORS_ORIGINS", '["*"]')
    assert Settings().cors_origins == ["*"]
