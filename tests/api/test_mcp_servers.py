"""/v1/mcp_servers: register, list, read, update, delete; credentials encrypted in the database,
never in a response nor a log line; refused URLs answer 422; tenants never see each other's;
re-encryption under a new key."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import httpx
import pytest
from cryptography.fernet import Fernet
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.config import Settings
from app.credentials import Vault, local_key
from app.db.tables import mcp_servers, runs
from app.openai_api.items import parse_response_id
from app.services import mcp_servers as service
from tests.conftest import ClientFactory

TOKEN = "tok-very-secret-4711"
HEADER_VALUE = "hdr-very-secret-0815"
BODY = {
    "name": "calc",
    "url": "http://127.0.0.1:9/mcp",
    "bearer_token": TOKEN,
    "headers": {"X-Api-Key": HEADER_VALUE},
    "allowed_tools": ["add"],
}


async def raw_credentials(engine: AsyncEngine, server_id: str) -> str:
    async with engine.connect() as conn:
        query = select(mcp_servers.c.credentials).where(mcp_servers.c.id == server_id)
        value: str = (await conn.execute(query)).scalar_one()
        return value


async def test_register_read_list_update_delete(
    client: httpx.AsyncClient,
    engine: AsyncEngine,
    settings: Settings,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    created = await client.post("/v1/mcp_servers", json=BODY)
    assert created.status_code == 201, created.text
    server = created.json()
    assert server["name"] == "calc" and server["transport"] == "streamable_http"
    assert server["allowed_tools"] == ["add"]
    assert server["credentials"] == {"header_names": ["X-Api-Key"], "bearer_token_set": True}
    sid = server["id"]

    responses = [
        created,
        await client.get(f"/v1/mcp_servers/{sid}"),
        await client.get("/v1/mcp_servers"),
    ]
    assert responses[1].json() == server
    assert [s["id"] for s in responses[2].json()["data"]] == [sid]

    stored = await raw_credentials(engine, sid)
    assert TOKEN not in stored and HEADER_VALUE not in stored
    assert Vault([local_key(settings.data_dir)]).decrypt_json(stored) == {
        "bearer_token": TOKEN,
        "headers": {"X-Api-Key": HEADER_VALUE},
    }

    patched = await client.patch(f"/v1/mcp_servers/{sid}", json={"bearer_token": ""})
    assert patched.status_code == 200, patched.text
    assert patched.json()["credentials"] == {
        "header_names": ["X-Api-Key"],
        "bearer_token_set": False,
    }
    moved = await client.patch(
        f"/v1/mcp_servers/{sid}", json={"url": "http://127.0.0.1:10/mcp", "allowed_tools": None}
    )
    assert moved.json()["url"] == "http://127.0.0.1:10/mcp"
    assert moved.json()["allowed_tools"] is None
    responses += [patched, moved]

    for response in responses:
        assert TOKEN not in response.text and HEADER_VALUE not in response.text
    assert TOKEN not in caplog.text and HEADER_VALUE not in caplog.text

    assert (await client.delete(f"/v1/mcp_servers/{sid}")).status_code == 204
    gone = await client.get(f"/v1/mcp_servers/{sid}")
    assert gone.status_code == 404
    assert gone.json()["error"]["code"] == "mcp_server_not_found"


async def test_a_name_is_taken_once_per_tenant(
    make_client: ClientFactory, new_key: Callable[[], Awaitable[str]]
) -> None:
    mine, theirs = make_client(await new_key()), make_client(await new_key())
    first = await mine.post("/v1/mcp_servers", json=BODY)
    assert first.status_code == 201
    again = await mine.post("/v1/mcp_servers", json=BODY)
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "mcp_server_exists"
    assert (await theirs.post("/v1/mcp_servers", json=BODY)).status_code == 201
    assert (await theirs.get(f"/v1/mcp_servers/{first.json()['id']}")).status_code == 404
    assert (await theirs.delete(f"/v1/mcp_servers/{first.json()['id']}")).status_code == 404


@pytest.mark.parametrize("name", ["a__b", "with space", "_lead", "x" * 33, "dot.ted"])
async def test_bad_names_are_refused(client: httpx.AsyncClient, name: str) -> None:
    response = await client.post("/v1/mcp_servers", json={**BODY, "name": name})
    assert response.status_code in (400, 422)
    assert "error" in response.json()


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data/",
        "http://[fd00:ec2::254]/",
        "http://metadata.google.internal/",
        "ftp://example.com/mcp",
    ],
)
async def test_unreachable_urls_are_refused_at_registration(
    client: httpx.AsyncClient, url: str
) -> None:
    response = await client.post("/v1/mcp_servers", json={**BODY, "url": url})
    assert response.status_code == 422, response.text
    assert response.json()["error"]["code"] == "url_not_allowed"
    assert TOKEN not in response.text


async def test_credentials_are_reencrypted_under_a_new_key(
    client: httpx.AsyncClient, engine: AsyncEngine, settings: Settings
) -> None:
    sid = (await client.post("/v1/mcp_servers", json=BODY)).json()["id"]
    old = local_key(settings.data_dir)
    new = Fernet.generate_key().decode()
    rotated = Settings(database_url=settings.database_url, secret_keys=[new, old])
    back = Settings(database_url=settings.database_url, secret_keys=[old, new])
    try:
        assert await service.reencrypt(engine, rotated) >= 1
        stored = await raw_credentials(engine, sid)
        assert Vault([new]).decrypt_json(stored)["bearer_token"] == TOKEN
    finally:  # the other tests' app still has only the old key
        await service.reencrypt(engine, back)
    assert Vault([old]).decrypt_json(await raw_credentials(engine, sid))["bearer_token"] == TOKEN


async def test_headers_of_a_waiting_runs_own_server_are_reencrypted(
    client: httpx.AsyncClient, engine: AsyncEngine, settings: Settings
) -> None:
    """A run whose request described its MCP server (the OpenAI facade's mcp tool) keeps that
    server's headers sealed in its params: a rotation re-encrypts them while the run is active,
    so that it still reaches the server once the old key is dropped."""
    tool = {
        "type": "mcp",
        "server_label": "calc",
        "server_url": "http://127.0.0.1:9/mcp",
        "headers": {"X-Api-Key": HEADER_VALUE},
    }
    created = await client.post(
        "/openai/v1/responses",
        json={"model": "gpt-4o-mini", "input": "hi", "tools": [tool], "background": True},
    )
    assert created.status_code == 200, created.text
    parsed = parse_response_id(created.json()["id"])
    assert parsed is not None
    run_id = parsed[0]
    old = local_key(settings.data_dir)
    new = Fernet.generate_key().decode()

    async def sealed() -> str:
        async with engine.connect() as conn:
            # (the test's run: the database is shared with the other tests of its process)
            query = select(runs.c.params).where(runs.c.id == run_id)
            params = (await conn.execute(query)).scalar_one()
        assert HEADER_VALUE not in str(params)
        value: str = params["mcp_inline"][0]["headers"]
        return value

    try:
        assert (
            await service.reencrypt(
                engine, Settings(database_url=settings.database_url, secret_keys=[new, old])
            )
            >= 1
        )
        assert Vault([new]).decrypt_json(await sealed()) == {"X-Api-Key": HEADER_VALUE}
    finally:
        await service.reencrypt(
            engine, Settings(database_url=settings.database_url, secret_keys=[old, new])
        )
    assert Vault([old]).decrypt_json(await sealed()) == {"X-Api-Key": HEADER_VALUE}
