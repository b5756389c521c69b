"""GET /metrics: Prometheus text, outside the authenticated API; open, behind its own token,
or off."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.config import Settings
from app.main import create_app

TOKEN = "metrics-token-0123456789"


async def scrape(settings: Settings, headers: dict[bytes, bytes] | None = None) -> httpx.Response:
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.get("/metrics", headers=headers or {})


async def test_open_by_default_and_parsable(settings: Settings) -> None:
    response = await scrape(settings)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    names = {f.name for f in text_string_to_metric_families(response.text)}
    assert {
        "threadline_asks",
        "threadline_runs",
        "threadline_first_token_seconds",
        "threadline_sse_streams_active",
        "threadline_queue_depth",
        "threadline_queue_oldest_job_age_seconds",
        "threadline_provider_calls",
        "threadline_journal_append_seconds",
    } <= names


@pytest.mark.parametrize(
    "authorization",
    [None, "Bearer wrong-token-0123456789", f"Basic {TOKEN}", TOKEN, "Bearer ", "Bearer é"],
)
async def test_a_token_guards_it(settings: Settings, authorization: str | None) -> None:
    guarded = settings.model_copy(update={"metrics_token": TOKEN})
    # Header values as sent on the wire (latin-1: a client may send any byte).
    headers = {b"authorization": authorization.encode("latin-1")} if authorization else {}
    refused = await scrape(guarded, headers)
    assert refused.status_code == 401
    assert refused.headers["www-authenticate"] == "Bearer"
    assert refused.json()["error"]["code"] == "unauthorized"
    allowed = await scrape(guarded, {b"authorization": f"Bearer {TOKEN}".encode()})
    assert allowed.status_code == 200 and "threadline_runs_total" in allowed.text


async def test_an_api_key_does_not_open_a_guarded_endpoint(
    settings: Settings, new_key: Callable[[], Awaitable[str]]
) -> None:
    key = await new_key()
    guarded = settings.model_copy(update={"metrics_token": TOKEN})
    assert (await scrape(guarded, {b"authorization": f"Bearer {key}".encode()})).status_code == 401


async def test_off_is_404(settings: Settings) -> None:
    off = await scrape(settings.model_copy(update={"metrics_enabled": False}))
    assert off.status_code == 404 and off.json()["error"]["code"] == "not_found"


def test_not_in_the_openapi_document(settings: Settings) -> None:
    assert "/metrics" not in create_app(settings).openapi()["paths"]
