"""The admin API (THREADLINE_ADMIN_KEY): off without the setting, its own key, tenants, keys
(revoked at once on every API process), limits and usage."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from app.config import Settings
from app.main import create_app
from testkit.server import serve_in_thread, stop_thread_server
from testkit.upstream import FakeUpstream, Text, Usage
from tests.conftest import ClientFactory
from tests.e2e import Service

ADMIN_KEY = "admin-" + "k" * 32


@pytest.fixture(scope="module")
def admin_url(e2e_settings: Settings) -> Iterator[str]:
    """An API process with the admin API on (no workers), on the served API's database."""
    settings = e2e_settings.model_copy(update={"admin_key": ADMIN_KEY})
    server, thread, url = serve_in_thread(create_app(settings))
    yield url
    stop_thread_server(server, thread)


@pytest.fixture
async def admin(admin_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        base_url=admin_url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=60
    ) as client:
        yield client


def as_key(url: str, key: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60)


async def test_off_without_an_admin_key(make_client: ClientFactory) -> None:
    response = await make_client("any-key-at-all").get("/v1/admin/tenants")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "admin_api_disabled"
    assert (await make_client(None).get("/v1/admin/tenants")).status_code == 401


async def test_only_the_admin_key_opens_it(admin: httpx.AsyncClient, admin_url: str) -> None:
    tenant = f"t-{uuid.uuid4()}"
    created = await admin.post(f"/v1/admin/tenants/{tenant}/keys", json={})
    tenant_key = created.json()["key"]
    for key in ("wrong" + ADMIN_KEY, tenant_key):
        async with as_key(admin_url, key) as other:
            response = await other.get("/v1/admin/tenants")
            assert response.status_code == 401, response.text
            assert response.headers["www-authenticate"] == "Bearer"
    async with httpx.AsyncClient(base_url=admin_url) as anonymous:
        assert (await anonymous.get("/v1/admin/tenants")).status_code == 401


async def test_tenants(admin: httpx.AsyncClient) -> None:
    name = f"acme-{uuid.uuid4()}"
    created = await admin.post("/v1/admin/tenants", json={"name": name})
    assert created.status_code == 201, created.text
    assert created.json()["name"] == name and created.json()["active_keys"] == 0
    again = await admin.post("/v1/admin/tenants", json={"name": name})
    assert again.status_code == 409 and again.json()["error"]["code"] == "tenant_exists"
    bad = await admin.post("/v1/admin/tenants", json={"name": "no spaces/or slashes"})
    assert bad.status_code == 422
    await admin.post(f"/v1/admin/tenants/{name}/keys", json={"name": "one"})
    listed = {t["name"]: t for t in (await admin.get("/v1/admin/tenants")).json()["data"]}
    assert listed[name]["active_keys"] == 1
    missing = await admin.get(f"/v1/admin/tenants/nobody-{uuid.uuid4()}/keys")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "tenant_not_found"


async def refused_soon(url: str, key: str) -> None:
    """The key is refused (401) as soon as this process hears of its revocation: a
    notification, which takes milliseconds; nothing is waited out."""
    deadline = time.monotonic() + 60
    async with as_key(url, key) as client:
        while (response := await client.get("/v1/sessions")).status_code == 200:
            assert time.monotonic() < deadline, f"{url} still takes the revoked key"
            await asyncio.sleep(0.01)
    assert response.status_code == 401, url
    assert response.json()["error"]["code"] == "unauthorized"


async def test_a_revoked_key_is_refused_by_every_process(
    admin: httpx.AsyncClient, admin_url: str, service: Service, second_api: str
) -> None:
    """Revoked through one API process: refused by that one on the next request, and by the
    others (one its own OS process) once the database's notification reaches them, though
    each had the key in its cache."""
    tenant = f"t-{uuid.uuid4()}"
    issued = (await admin.post(f"/v1/admin/tenants/{tenant}/keys", json={"name": "ci"})).json()
    urls = (service.url, second_api, admin_url)
    for url in urls:
        async with as_key(url, issued["key"]) as client:
            assert (await client.get("/v1/sessions")).status_code == 200, url
    revoked = await admin.post(f"/v1/admin/keys/{issued['id']}/revoke")
    assert revoked.status_code == 200 and revoked.json()["revoked_at"] is not None
    assert "key" not in revoked.json()
    async with as_key(admin_url, issued["key"]) as client:
        assert (await client.get("/v1/sessions")).status_code == 401
    for url in urls:
        await refused_soon(url, issued["key"])
    (listed,) = (await admin.get(f"/v1/admin/tenants/{tenant}/keys")).json()["data"]
    assert listed["id"] == issued["id"] and listed["revoked_at"] is not None
    assert listed["last_used_at"] is not None and "key" not in listed
    missing = await admin.post(f"/v1/admin/keys/{uuid.uuid4()}/revoke")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "key_not_found"


async def test_rotate(admin: httpx.AsyncClient, second_api: str) -> None:
    tenant = f"t-{uuid.uuid4()}"
    old = (
        await admin.post(
            f"/v1/admin/tenants/{tenant}/keys", json={"name": "web", "read_only": True}
        )
    ).json()
    assert old["read_only"] is True and old["prefix"] == old["key"][:12]
    rotated = await admin.post(f"/v1/admin/keys/{old['id']}/rotate")
    assert rotated.status_code == 201
    new = rotated.json()
    assert (new["name"], new["read_only"], new["tenant"]) == ("web", True, tenant)
    async with as_key(second_api, old["key"]) as client:
        assert (await client.get("/v1/sessions")).status_code == 401
    async with as_key(second_api, new["key"]) as client:
        assert (await client.get("/v1/sessions")).status_code == 200
    graced = (
        await admin.post(f"/v1/admin/keys/{new['id']}/rotate", json={"grace_seconds": 600})
    ).json()
    for key in (new["key"], graced["key"]):  # both work during the grace period
        async with as_key(second_api, key) as client:
            assert (await client.get("/v1/sessions")).status_code == 200
    again = await admin.post(f"/v1/admin/keys/{old['id']}/rotate")
    assert again.status_code == 422 and again.json()["error"]["code"] == "key_revoked"


async def test_limits(admin: httpx.AsyncClient) -> None:
    tenant = f"t-{uuid.uuid4()}"
    await admin.post("/v1/admin/tenants", json={"name": tenant})
    shown = (await admin.get(f"/v1/admin/tenants/{tenant}/limits")).json()
    unlimited = {
        "requests_per_minute": None,
        "concurrent_runs": None,
        "input_tokens_per_day": None,
        "output_tokens_per_day": None,
        "max_sessions": None,
    }
    assert shown == {"tenant": tenant, "own": unlimited, "effective": unlimited}
    patched = await admin.patch(
        f"/v1/admin/tenants/{tenant}/limits", json={"requests_per_minute": 60, "max_sessions": 5}
    )
    assert patched.status_code == 200
    assert patched.json()["effective"] == {
        **unlimited,
        "requests_per_minute": 60,
        "max_sessions": 5,
    }
    back = await admin.patch(f"/v1/admin/tenants/{tenant}/limits", json={"max_sessions": None})
    assert back.json()["own"] == {**unlimited, "requests_per_minute": 60}
    for body in ({"max_sessions": -1}, {"max_sessions": "5"}, {"nonsense": 1}):
        bad = await admin.patch(f"/v1/admin/tenants/{tenant}/limits", json=body)
        assert bad.status_code == 422, body
    missing = await admin.get(f"/v1/admin/tenants/nobody-{uuid.uuid4()}/limits")
    assert missing.status_code == 404


async def test_usage_of_one_tenant_or_all(
    admin: httpx.AsyncClient, service: Service, upstream: FakeUpstream
) -> None:
    upstream.clear()
    tenant = f"t-{uuid.uuid4()}"
    key = (await admin.post(f"/v1/admin/tenants/{tenant}/keys", json={})).json()["key"]
    async with as_key(service.url, key) as client:
        sid = (await client.post("/v1/sessions", json={})).json()["id"]
        upstream.script(Text("ok"), Usage(7, 2))
        run = (
            await client.post(f"/v1/sessions/{sid}/ask", json={"input": "q", "stream": False})
        ).json()
        ended = await client.get(f"/v1/runs/{run['id']}", params={"wait": "true"})
        assert ended.json()["status"] == "completed"
        own = (await client.get("/v1/usage")).json()
    one = (await admin.get("/v1/admin/usage", params={"tenant": tenant})).json()
    assert one == own
    assert (one["totals"]["input_tokens"], one["totals"]["output_tokens"]) == (7, 2)
    everyone = (await admin.get("/v1/admin/usage")).json()
    assert [r for r in everyone["data"] if r["tenant"] == tenant] == one["data"]
    missing = await admin.get("/v1/admin/usage", params={"tenant": f"nobody-{uuid.uuid4()}"})
    assert missing.status_code == 404


@pytest.fixture(scope="module")
def admin_schema(admin_url: str) -> Any:
    loaded = schemathesis.openapi.from_url(f"{admin_url}/openapi.json")
    loaded.config.update(base_url=admin_url, headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    checks = loaded.config.checks
    checks.negative_data_rejection = type(checks.negative_data_rejection)(
        expected_statuses=[400, 401, 404, 409, 413, 422]
    )
    return loaded


# The filter goes on the lazy schema: schemathesis replaces the filters of the fixture's own
# schema with the lazy one's (one set on the fixture fuzzed the whole document, 44 operations).
admin_schema_ = schemathesis.pytest.from_fixture("admin_schema").include(path_regex=r"^/v1/admin/")


@admin_schema_.parametrize()
@settings(max_examples=25, derandomize=True, suppress_health_check=list(HealthCheck))
def test_the_admin_api_honours_its_document(case: Any) -> None:
    """Fuzzed with the admin key: no 500, every answer as documented, bad input refused."""
    case.call_and_validate(
        checks=[
            not_a_server_error,
            status_code_conformance,
            content_type_conformance,
            response_schema_conformance,
            response_headers_conformance,
            negative_data_rejection,
        ]
    )
